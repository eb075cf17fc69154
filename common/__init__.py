"""The base layer every folder shares: settings and their checks, the serving contract (file and tensor
names, serving.json), token layouts and TensorRT profile arithmetic. It imports nothing of this project's
other packages. The generated model repository carries a copy, so the stages import it inside Triton too."""
