"""``LocationKey`` on the wire: the one conversion between the record and its proto message.

Every service and client sends location keys; converting in one place keeps the four fields in
one order and makes every key read off the wire pass the name validation of ``disd.names``.
"""

from __future__ import annotations

from disd.names import LocationKey
from disd.rpc.v1 import dis_pb2


def key_to_proto(key: LocationKey) -> dis_pb2.LocationKey:
    return dis_pb2.LocationKey(namespace=key.namespace, table=key.table,
                               internal_partition=key.internal_partition, column_partition=key.column_partition)


def key_from_proto(msg: dis_pb2.LocationKey) -> LocationKey:
    """The key a message names; ``InvalidNameError`` when a field is not a valid name."""
    return LocationKey(msg.namespace, msg.table, msg.internal_partition, msg.column_partition)
