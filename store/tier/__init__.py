"""The S3 tier: a cluster's chunks of class ``s3``, one object each in a bucket.

Owns ``Bucket`` (``_bucket``, through obstore, the ``s3`` extra): the leading
metadata service puts a chunk there when it converts it, and data nodes read
it through on a miss (their cache in front of it is the node's ``_tier``).
The servers' alone: the client reads such chunks through the data nodes.

May import: the store's shared modules; no other layer.
"""

from ._bucket import CALL_S, Bucket

__all__ = ["CALL_S", "Bucket"]
