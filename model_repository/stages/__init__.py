"""The Python models Triton runs, and their core: each model version holds a copy of this package as
`stages/` (engines/ included) beside `common/`, and a model.py that imports one of the *_model modules."""
