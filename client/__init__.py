"""Python client for the text ensemble over gRPC or HTTP, sync and asyncio."""

from client.core import AsyncTextClient, ClientError, RetryPolicy, TextClient

__all__ = ["AsyncTextClient", "ClientError", "RetryPolicy", "TextClient"]
