"""python -m serving.api: the API front; serving/api/app.py has its routes and options."""

from serving.processes import prefer_grpc_poller

prefer_grpc_poller()  # before serving.api.app imports grpc

from serving.api.app import main  # noqa: E402

main()
