"""Hugging Face BERT checkpoint -> validated ONNX model plus what the serving stages need."""
