"""S3 errors as this package's errors: botocore's, boto3's and s3transfer's errors (and
urllib3's, for a body that broke off) mapped to the ``StorageError`` subclasses of
:mod:`airflow_ckpt.errors`, with a hint where the code says what to fix.

A missing bucket is told apart from a missing object, and from a 403 that some servers
(SeaweedFS) answer for a write into a missing bucket, by one HeadBucket (cached once the
bucket is known to exist), made only on an error path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, NoReturn

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    CredentialRetrievalError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
    ResponseStreamingError,
    SSLError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError
from urllib3.exceptions import ProtocolError as URLLib3ProtocolError

from airflow_ckpt.errors import (
    BucketNotFoundError,
    EndpointUnreachableError,
    ObjectNotFoundError,
    StorageAccessDeniedError,
    StorageError,
)

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

ACCESS_CODES = frozenset({
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled",
    "InvalidToken", "ExpiredToken", "TokenRefreshRequired", "AccountProblem",
    "InvalidSecurity", "RequestTimeTooSkewed", "403", "Forbidden", "UnauthorizedAccess",
})
#: 403 codes about the credentials themselves: no HeadBucket can say more about them
CREDENTIAL_CODES = frozenset({
    "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken",
    "TokenRefreshRequired", "RequestTimeTooSkewed",
})
NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
PRECONDITION_CODES = frozenset({"PreconditionFailed", "412"})
CONFLICT_CODE = "ConditionalRequestConflict"  # 409: a concurrent conditional write
TOO_LARGE_CODES = frozenset({"InvalidRequest", "EntityTooLarge"})
CODE_HINTS = {
    "RequestTimeTooSkewed": "the local clock is off; synchronise it (NTP)",
    "ExpiredToken": "the session token expired; refresh the credentials",
    "SignatureDoesNotMatch": "the secret access key does not match the access key id",
    "InvalidAccessKeyId": "the access key id is unknown to this endpoint",
    "PermanentRedirect": "the bucket is in another region; set region_name or "
    "AWS_DEFAULT_REGION to the bucket's region",
    "AuthorizationHeaderMalformed": "the region is wrong; set region_name or "
    "AWS_DEFAULT_REGION to the bucket's region",
    "NotImplemented": "the endpoint does not implement this S3 feature",
}

# botocore retries a request whose answer broke off only while it parses the answer: a
# GetObject body is read after its retries, so a body cut short is retried by the storage. The
# error body of a GetObject (404, 412...) is read by botocore outside its retries and
# its break surfaces as urllib3's own ProtocolError.
BODY_ERRORS = (ResponseStreamingError, IncompleteReadError, URLLib3ProtocolError)


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def http_status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def is_missing(exc: ClientError) -> bool:
    """A 404 of any kind (NoSuchKey, NoSuchBucket, or a body-less HEAD 404)."""
    return error_code(exc) in NOT_FOUND_CODES | {"NoSuchBucket"} or http_status(exc) == 404


def root_cause(exc: BaseException) -> BaseException:
    """The botocore error behind wrappers (boto3/s3transfer re-raise with context)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ClientError | BotoCoreError):
            return current
        last = getattr(current, "last_exception", None)
        current = last if isinstance(last, BaseException) else (
            current.__cause__ or current.__context__
        )
    return exc


def refused_as_existing(exc: ClientError) -> bool:
    """A create-only PutObject refused because the object exists (412) or is being
    written concurrently (409)."""
    code = error_code(exc)
    return code in PRECONDITION_CODES or code == CONFLICT_CODE or http_status(exc) in (409, 412)


class S3Errors:
    """Raises the errors of one bucket's requests as ``StorageError`` subclasses.

    ``client`` makes the HeadBucket that tells a missing bucket apart; ``uri`` and
    ``endpoint_url`` name where a request went in the messages.
    """

    def __init__(self, client: S3Client, bucket: str, uri: str, endpoint_url: str) -> None:
        self._client = client
        self.bucket = bucket
        self.uri = uri
        self.endpoint_url = endpoint_url
        #: the bucket is known to exist (a request succeeded on it)
        self.bucket_known = False

    def where(self, key: str) -> str:
        return f"{self.uri}/{key}" if key else self.uri

    def raise_(self, exc: BaseException, action: str, key: str) -> NoReturn:
        """Re-raise a boto3/botocore/s3transfer error as a ``StorageError`` subclass."""
        cause = root_cause(exc)
        where = self.where(key)
        at = f"at endpoint {self.endpoint_url}"
        if isinstance(cause, ClientError):
            code, status = error_code(cause), http_status(cause)
            message = cause.response.get("Error", {}).get("Message", "") or code
            hint = CODE_HINTS.get(code)
            detail = f"{code}: {message}" + (f"; {hint}" if hint else "")
            if code == "NoSuchBucket":
                raise BucketNotFoundError(
                    f"cannot {action} {where}: bucket {self.bucket!r} does not exist {at}; "
                    "create it or fix the URI"
                ) from exc
            if (code in ACCESS_CODES or status == 403) and code not in CREDENTIAL_CODES \
                    and not self.bucket_exists():
                # Some servers (SeaweedFS) answer a write into a missing bucket with
                # 403 AccessDenied; HeadBucket's 404 tells the two apart.
                raise BucketNotFoundError(
                    f"cannot {action} {where}: bucket {self.bucket!r} does not exist {at} "
                    f"(the endpoint answered {detail}; HeadBucket answers 404); create it "
                    "or fix the URI"
                ) from exc
            if code in ACCESS_CODES or status == 403:
                raise StorageAccessDeniedError(
                    f"cannot {action} {where}: access denied {at} ({detail}); check the "
                    "credentials (connection login/password or AWS_ACCESS_KEY_ID / "
                    "AWS_SECRET_ACCESS_KEY) and that they may access this bucket and prefix"
                ) from exc
            if code in NOT_FOUND_CODES or status == 404:
                if not self.bucket_exists():
                    raise BucketNotFoundError(
                        f"cannot {action} {where}: bucket {self.bucket!r} does not exist "
                        f"{at}; create it or fix the URI (if it does exist, check that "
                        "the endpoint is the S3 server that holds it)"
                    ) from exc
                raise ObjectNotFoundError(f"cannot {action} {where}: no such object") from exc
            raise StorageError(f"cannot {action} {where} {at}: {detail}") from exc
        if isinstance(cause, NoCredentialsError | PartialCredentialsError):
            raise StorageAccessDeniedError(
                f"cannot {action} {where}: no usable AWS credentials ({cause}); set them on "
                "the connection or in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
            ) from exc
        if isinstance(cause, CredentialRetrievalError):
            raise StorageAccessDeniedError(
                f"cannot {action} {where}: fetching credentials failed ({cause})"
            ) from exc
        if isinstance(cause, SSLError):
            raise EndpointUnreachableError(
                f"cannot {action} {where}: TLS handshake with {self.endpoint_url} failed "
                f"({cause}); check the endpoint's scheme (http/https) and certificate"
            ) from exc
        if isinstance(cause, ResponseStreamingError | IncompleteReadError
                      | URLLib3ProtocolError):
            # transient like an unreachable endpoint: sensors and triggers poll again
            raise EndpointUnreachableError(
                f"cannot {action} {where}: the response from {self.endpoint_url} broke off "
                f"while it was read ({cause}): a network fault, or the endpoint failed "
                "mid-transfer"
            ) from exc
        if isinstance(cause, BotoConnectionError | HTTPClientError):
            raise EndpointUnreachableError(
                f"cannot {action} {where}: endpoint {self.endpoint_url} unreachable after "
                f"retries ({cause}); check endpoint_url / AWS_ENDPOINT_URL and that the "
                "server is running and reachable from this host"
            ) from exc
        if isinstance(cause, BotoCoreError):
            raise StorageError(f"cannot {action} {where} {at}: {cause}") from exc
        raise exc

    @contextlib.contextmanager
    def translate(self, action: str, key: str) -> Iterator[None]:
        """Raise the S3 errors of the ``with`` block as ours (``action`` and ``key`` name
        the request in the message); a ``StorageError`` passes unchanged."""
        try:
            yield
        except StorageError:
            raise
        except (ClientError, BotoCoreError, URLLib3ProtocolError) as exc:
            self.raise_(exc, action, key)

    def bucket_exists(self) -> bool:
        """Whether the bucket exists (cached once known). Only used on error paths."""
        if self.bucket_known:
            return True
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            # 403 etc.: it exists as far as we can tell; let the original error speak
            return not is_missing(exc)
        except BotoCoreError:
            return True  # let the original error speak
        self.bucket_known = True
        return True

    def check_bucket(self) -> None:
        """The HeadBucket of ``S3Storage.check``: ``BucketNotFoundError`` when the bucket
        is missing, the mapped error when the request fails otherwise."""
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            if is_missing(exc):
                raise BucketNotFoundError(
                    f"bucket {self.bucket!r} does not exist at endpoint {self.endpoint_url}; "
                    f"create it or fix the URI ({self.uri})"
                ) from exc
            self.raise_(exc, "access", "")
        except BotoCoreError as exc:
            self.raise_(exc, "access", "")
        self.bucket_known = True
