"""The HTTP front (`python -m serving.http_front`): KServe v2 over HTTP, with body limits, before tritonserver's
own HTTP on loopback (proxy.py)."""
