"""The API front (`python -m serving.api`): the OpenAI- and TEI-compatible routes embedding users already call,
answered by the ensemble over gRPC. app.py: the routes and the worker; schema.py: request and response shapes;
triton_link.py: the pooled gRPC calls."""
