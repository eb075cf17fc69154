"""The processes around tritonserver, a folder each: launcher/ (tritonserver's parent: supervision, health,
watchdog, metrics port), http_front/ (KServe v2 HTTP before Triton's own), api/ (OpenAI- and TEI-compatible
routes over gRPC). What they share sits here: processes.py (children that die with their parent, busy ports,
ServerError) and workers.py (a front's worker processes on one port)."""
