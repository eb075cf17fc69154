"""The Python stages Triton runs (each model version holds a copy of this package as `stages/`)."""
