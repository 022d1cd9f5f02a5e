"""Where the S3 store keeps things: ``s3://BUCKET[/PREFIX]``, an endpoint URL for
S3-compatible stores, and a region (checked here without importing boto3, so that a bad flag is
one line at the server's start)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlparse

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_REGION = re.compile(r"^[a-z0-9-]{1,40}$")


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str = ""
    """Put before every key: empty, or ending with ``/``."""
    endpoint_url: str | None = None
    region: str | None = None

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    @classmethod
    def parse(
        cls, url: str, endpoint_url: str | None = None, region: str | None = None
    ) -> S3Location:
        """ValueError saying what is wrong with a URL, an endpoint or a region."""
        bucket, prefix = check_url(url)
        return cls(bucket, prefix, check_endpoint(endpoint_url), check_region(region))


def check_url(url: str) -> tuple[str, str]:
    """The bucket and the prefix (empty, or ending with ``/``) of ``s3://BUCKET[/PREFIX]``."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"{url!r} is not s3://BUCKET[/PREFIX]")
    if parsed.query or parsed.fragment or "@" in parsed.netloc or ":" in parsed.netloc:
        raise ValueError(f"{url!r}: give s3://BUCKET[/PREFIX] alone (credentials come from the "
                         "AWS environment, the endpoint from --s3-endpoint-url)")  # fmt: skip
    bucket = parsed.netloc
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise ValueError(f"{bucket!r} is not a bucket name (3 to 63 lower-case letters, digits, "
                         "'.' and '-', starting and ending with a letter or digit)")  # fmt: skip
    parts = [part for part in parsed.path.split("/") if part]
    if any(part in (".", "..") for part in parts):
        raise ValueError(f"{url!r}: the prefix may not hold '.' or '..'")
    return bucket, "".join(f"{part}/" for part in parts)


def check_endpoint(endpoint_url: str | None) -> str | None:
    if endpoint_url is not None:
        endpoint = urlparse(endpoint_url)
        if endpoint.scheme not in ("http", "https") or not endpoint.hostname:
            raise ValueError(f"{endpoint_url!r} is not an endpoint URL (http(s)://HOST[:PORT])")
    return endpoint_url


def check_region(region: str | None) -> str | None:
    if region is not None and not _REGION.match(region):
        raise ValueError(f"{region!r} is not a region name (such as us-east-1)")
    return region
