"""Enqueue a job into a partitioned Pelican queue with redis-py (docs/wire-format.md, "Partitioned queues")."""
import binascii
import json
import os
import zlib

import redis


def partition_stream(queue, n, i):
    """The stream of partition i of queue's n partitions: {queue~n~i~k}, k the smallest suffix whose
    hash tag has a Redis Cluster slot (CRC16 XMODEM mod 16384) in the i-th of n equal slot ranges."""
    lo, hi = i * 16384 // n, (i + 1) * 16384 // n
    k = 0
    while True:
        tag = f"{queue}~{n}~{i}~{k}"
        if lo <= binascii.crc_hqx(tag.encode(), 0) % 16384 < hi:
            return "{" + tag + "}"
        k += 1


def partitions(queue, n):
    return [partition_stream(queue, n, i) for i in range(n)]


def partition_of(key, n):
    """The partition of a job routed by key: CRC-32 (IEEE) of the key's UTF-8 bytes mod n."""
    return zlib.crc32(key.encode()) % n


if __name__ == "__main__":
    r = redis.Redis(
        host=os.environ.get("REDIS_HOST", "127.0.0.1"),
        port=int(os.environ.get("REDIS_PORT", "6379")),
    )  # on Redis Cluster: redis.cluster.RedisCluster(host=..., port=...)
    queue = os.environ.get("PELICAN_QUEUE", "orders")
    n = int(os.environ.get("PELICAN_PARTITIONS", "12"))
    key = "customer-42"  # every job of this key goes to the same partition, in order
    stream = partition_stream(queue, n, partition_of(key, n))
    entry_id = r.xadd(
        stream,
        {"type": "order.confirm", "payload": json.dumps({"order": 7}), "idempotency_key": key},
    )
    print(stream, entry_id.decode())
