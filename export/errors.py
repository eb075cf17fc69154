"""The export's one error: a checkpoint source that cannot be served as asked, said with what to change."""


class CheckpointError(ValueError):
    """The checkpoint source cannot be used."""
