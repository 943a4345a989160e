"""Blob storage: images and offloaded chat requests, kept outside the request
row and handed to workers as signed, expiring URLs (hordelite.contract.signing).
"""

from hordelite.blobs._directory import DirectoryStore, blob_directory
from hordelite.blobs._s3 import S3Error, S3Store
from hordelite.blobs._store import Blob, BlobStore

__all__ = ["Blob", "BlobStore", "DirectoryStore", "S3Error", "S3Store", "blob_directory"]
