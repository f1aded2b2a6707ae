"""The S3 fixture: SeaweedFS answering real S3 calls through aiobotocore."""

from __future__ import annotations

import hashlib
import os

import pytest
from aiobotocore.session import get_session

from nodus_testing.seaweed import SeaweedS3

MiB = 1024 * 1024

# Starting SeaweedFS takes about 4 s here; whichever S3 test runs first pays for it.
pytestmark = [pytest.mark.s3, pytest.mark.slow]


async def test_bucket_put_get_multipart_list(seaweed: SeaweedS3, unique: str) -> None:
    bucket = f"{unique}-bucket"
    async with get_session().create_client("s3", **seaweed.client_kwargs()) as s3:
        await s3.create_bucket(Bucket=bucket)

        await s3.put_object(Bucket=bucket, Key="small.txt", Body=b"hello s3")
        got = await s3.get_object(Bucket=bucket, Key="small.txt")
        async with got["Body"] as body:
            assert await body.read() == b"hello s3"

        # ~12 MiB in 3 parts (S3 wants every part but the last to be at least 5 MiB).
        data = os.urandom(12 * MiB)
        chunks = [data[: 5 * MiB], data[5 * MiB : 10 * MiB], data[10 * MiB :]]
        upload = await s3.create_multipart_upload(Bucket=bucket, Key="big/blob.bin")
        parts = []
        for number, chunk in enumerate(chunks, start=1):
            part = await s3.upload_part(
                Bucket=bucket, Key="big/blob.bin", UploadId=upload["UploadId"], PartNumber=number, Body=chunk
            )
            parts.append({"PartNumber": number, "ETag": part["ETag"]})
        await s3.complete_multipart_upload(
            Bucket=bucket,
            Key="big/blob.bin",
            UploadId=upload["UploadId"],
            MultipartUpload={"Parts": parts},
        )
        got = await s3.get_object(Bucket=bucket, Key="big/blob.bin")
        async with got["Body"] as body:
            assert hashlib.sha256(await body.read()).hexdigest() == hashlib.sha256(data).hexdigest()
        assert got["ContentLength"] == 12 * MiB

        listed = await s3.list_objects_v2(Bucket=bucket)
        assert sorted(o["Key"] for o in listed["Contents"]) == ["big/blob.bin", "small.txt"]
        listed = await s3.list_objects_v2(Bucket=bucket, Prefix="big/")
        assert [o["Key"] for o in listed["Contents"]] == ["big/blob.bin"]

        buckets = await s3.list_buckets()
        assert bucket in {b["Name"] for b in buckets["Buckets"]}
