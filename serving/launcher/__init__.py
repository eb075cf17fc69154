"""The launcher (`python -m serving.launcher`, what `make serve` and the server image run): tritonserver as its
child, supervised, with the fronts and ports around it. __main__.py wires it; supervision.py owns its state."""
