"""The shared server-test helpers report a server's GraphQL error at once, with its message.

Before, the polling loop caught the AssertionError of a refused query, so a real GraphQL error became a 2-3 minute
timeout whose message was lost (issue 15). A tiny loopback HTTP server answers every query with a GraphQL error, as
the Dagster webserver does for a query naming a field it does not have."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from tests.daemon_helpers import GraphQLError, graphql, wait_for

MESSAGE = "Cannot query field \"runz\" on type \"Query\"."


class _Refusing(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"errors": [{"message": MESSAGE}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def refusing_server():
    server = HTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_a_graphql_error_while_polling_fails_with_the_servers_message_not_a_timeout(refusing_server):
    with pytest.raises(GraphQLError, match="runz") as raised:
        wait_for("runs to finish", lambda: graphql(refusing_server, "{ runz { id } }"), None, seconds=3)
    assert "timed out" not in str(raised.value)
