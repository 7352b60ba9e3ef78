"""A real moto S3 server that checks credentials, for tests of refused access.

moto_server accepts any key unless INITIAL_NO_AUTH_ACTION_COUNT is set: then the first N requests are served
unauthenticated and every later one must be signed with an access key moto's IAM knows (a wrong key id gets
`InvalidAccessKeyId`, a wrong secret `SignatureDoesNotMatch`, both 403). The free requests create a user with an
s3:* policy and its access key; the bucket is then created with that key. It runs in its own process, so the
authentication switch does not reach the shared in-process server of tests/conftest.py.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import free_port

UNAUTHENTICATED_SETUP_REQUESTS = 3  # create_user, put_user_policy, create_access_key


@dataclass(frozen=True)
class AuthenticatedS3:
    endpoint: str
    key_id: str
    secret: str
    bucket: str
    region: str = "us-east-1"

    def client(self, key_id: str | None = None, secret: str | None = None):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=self.region,
                            aws_access_key_id=key_id or self.key_id, aws_secret_access_key=secret or self.secret)

    def keys(self, prefix: str = "") -> list[str]:
        """Every object under `prefix`, listed with the right key."""
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]


@contextmanager
def authenticated_s3(bucket: str = "creds-bucket") -> Iterator[AuthenticatedS3]:
    import boto3

    from tests.daemon_helpers import dev_server

    port = free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(UNAUTHENTICATED_SETUP_REQUESTS)}
    command = [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)]
    with tempfile.TemporaryDirectory() as tmp, dev_server(command, env, Path(tmp) / "moto.log") as server:
        deadline = time.monotonic() + 30
        while True:
            assert server.poll() is None, "moto_server exited"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "moto_server did not start"
                time.sleep(0.1)
        endpoint = f"http://127.0.0.1:{port}"
        iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1",
                           aws_access_key_id="setup", aws_secret_access_key="setup")
        iam.create_user(UserName="pipeline")
        iam.put_user_policy(UserName="pipeline", PolicyName="s3", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="pipeline")["AccessKey"]
        s3 = AuthenticatedS3(endpoint, key["AccessKeyId"], key["SecretAccessKey"], bucket)
        s3.client().create_bucket(Bucket=bucket)
        yield s3
