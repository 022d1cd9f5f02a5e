"""The bucket as the S3 store reaches it: one boto3 client (credentials from the standard AWS
chain only), keys under the store's prefix, and every failure to reach the bucket turned into
:class:`StorageUnavailable` quickly.

Timeouts are short and retries few: a bucket that is away must be a quick 503 to the caller (who
retries) rather than a request that hangs. Calls that wait on the store's work (completing an
upload, copying, putting a log part, reading a whole object) get a patient client.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from api.artifacts.s3_location import S3Location
from api.artifacts.store import StorageUnavailable

CONNECT_TIMEOUT_S = 1.0
QUICK_READ_TIMEOUT_S = 5.0
PATIENT_READ_TIMEOUT_S = 60.0
ATTEMPTS = 2
"""Each call's attempts in all (botocore's standard retry mode: connection errors, 5xx and
throttling are retried once)."""
POOL = 50
PRESIGNED_S = 3600
"""How long a presigned URL works."""
NO_CREDENTIALS = ("no AWS credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                  "a shared config profile, or an instance role)")
_MISSING = {"404", "NoSuchKey", "NotFound"}


def missing(error: ClientError) -> bool:
    return str(error.response.get("Error", {}).get("Code")) in _MISSING


def error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


class S3Bucket:
    def __init__(self, location: S3Location) -> None:
        self.location = location
        self.name = location.bucket
        self.where = location.url
        session = boto3.session.Session()
        self.client = self._client(session, QUICK_READ_TIMEOUT_S)
        self.patient = self._client(session, PATIENT_READ_TIMEOUT_S)

    def _client(self, session: Any, read_timeout_s: float) -> Any:
        location = self.location
        config = Config(
            connect_timeout=CONNECT_TIMEOUT_S, read_timeout=read_timeout_s,
            retries={"mode": "standard", "total_max_attempts": ATTEMPTS},
            signature_version="s3v4", max_pool_connections=POOL,
            # An S3-compatible store on a host name of its own rarely serves buckets as
            # subdomains: address them by path there.
            s3={"addressing_style": "path" if location.endpoint_url else "auto"},
        )  # fmt: skip
        return session.client("s3", endpoint_url=location.endpoint_url,
                              region_name=location.region, config=config)  # fmt: skip

    def key(self, key: str) -> str:
        return self.location.prefix + key

    @contextmanager
    def reaching(self, what: str) -> Iterator[None]:
        """StorageUnavailable for whatever keeps the bucket from answering; FileNotFoundError
        for an object that is not there."""
        try:
            yield
        except FileNotFoundError:
            raise
        except ClientError as error:
            if missing(error):
                raise FileNotFoundError(what) from error
            message = error.response.get("Error", {}).get("Message") or error_code(error)
            raise StorageUnavailable(what, self.where, f"{error_code(error)}: {message}") from error
        except NoCredentialsError as error:
            raise StorageUnavailable(what, self.where, NO_CREDENTIALS) from error
        except (BotoCoreError, OSError) as error:
            raise StorageUnavailable(what, self.where, str(error)) from error

    def check(self) -> None:
        """StorageUnavailable saying what is wrong unless the bucket answers (at start)."""
        try:
            self.client.head_bucket(Bucket=self.name)
        except ClientError as error:
            code = error_code(error)
            reason = {
                "404": f"there is no bucket {self.name!r}: create it, or name another",
                "NoSuchBucket": f"there is no bucket {self.name!r}: create it, or name another",
                "403": "access denied: check the AWS credentials and the bucket's policy",
                "AccessDenied": "access denied: check the AWS credentials and the bucket's policy",
                "301": "the bucket is in another region: give it with --s3-region",
                "400": "the request was refused (a wrong --s3-region or endpoint?)",
            }.get(code, f"{code}: {error.response.get('Error', {}).get('Message') or 'refused'}")
            raise StorageUnavailable("artifacts", self.where, reason) from error
        except NoCredentialsError as error:
            raise StorageUnavailable("artifacts", self.where, NO_CREDENTIALS) from error
        except (BotoCoreError, OSError) as error:
            endpoint = self.location.endpoint_url or "S3"
            raise StorageUnavailable(
                "artifacts", self.where, f"{endpoint} does not answer ({error})"
            ) from error

    # -- objects --------------------------------------------------------------------------

    def head(self, key: str) -> dict[str, Any] | None:
        """The object's metadata, or None when there is none."""
        try:
            with self.reaching(key):
                answer: dict[str, Any] = self.client.head_object(
                    Bucket=self.name, Key=self.key(key)
                )
                return answer
        except FileNotFoundError:
            return None

    def size(self, key: str) -> int | None:
        head = self.head(key)
        return None if head is None else int(head["ContentLength"])

    def put(self, key: str, data: bytes) -> None:
        with self.reaching(key):
            self.patient.put_object(Bucket=self.name, Key=self.key(key), Body=data)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """The object's bytes from ``start`` up to ``end`` (excluded)."""
        if end <= start:
            return b""
        with self.reaching(key):
            answer = self.patient.get_object(
                Bucket=self.name, Key=self.key(key), Range=f"bytes={start}-{end - 1}"
            )
            data: bytes = answer["Body"].read()
        return data

    def delete(self, key: str) -> None:
        with self.reaching(key):
            self.client.delete_object(Bucket=self.name, Key=self.key(key))

    def delete_prefix(self, prefix: str) -> int:
        """Remove every object whose key starts with ``prefix``; how many went."""
        count = 0
        with self.reaching(prefix):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.name, Prefix=self.key(prefix)
            )
            for page in pages:
                keys = [{"Key": item["Key"]} for item in page.get("Contents", ())]
                if keys:
                    self.client.delete_objects(
                        Bucket=self.name, Delete={"Objects": keys, "Quiet": True}
                    )
                    count += len(keys)
        return count

    def presign(self, method: str, params: dict[str, Any]) -> str:
        with self.reaching("a presigned URL"):
            url: str = self.client.generate_presigned_url(
                method, Params={"Bucket": self.name, **params}, ExpiresIn=PRESIGNED_S
            )
        return url
