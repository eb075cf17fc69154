"""Settings, stage code and generator for the Triton model repository."""
