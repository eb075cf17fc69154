"""Checkpoints saved by each library version itself (sentence-transformers 2.7 to the newest, PyLate, FlagEmbedding),
with that version's own outputs beside each: what tests/model/test_checkpoint_formats.py holds the export to.

base_tokenizers.py runs in the main environment; save_checkpoints.py in each writer environment (make
compat-fixtures), importing nothing of this repository.
"""
