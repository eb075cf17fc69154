"""The base layer, and exactly what the stages import: the serving contract (file and tensor names,
serving.json), token padding and chunking, and how a checkpoint's tokenizer is opened. It imports nothing
else of this project. Every Python model version of the generated repository carries a copy beside
stages/, so the stages import it inside Triton too."""
