"""``dis proxy``: the Table Data Cache Proxy (docs/proxy.md).

Readers connect to a proxy as to a DIS (the read side of the gRPC contract and the HTTP block
endpoint); the proxy holds one upstream subscription per table however many readers subscribe,
and a byte-bounded block cache shared by all of them, so thousands of readers cost the DISes
tens of subscriptions and each block about once.

``config`` (proxy.yaml), ``upstream`` (the DISes behind it: one feed per table, the sizes the
proxy has published, forwarded catalogue and status calls), ``cache`` (blocks keyed by the
published size they were read at, fetched upstream once however many readers miss them),
``service`` (the TableData service and the block endpoint's backend), ``lastbyfeed`` (one
upstream SubscribeLastBy per table, the last-by states the proxy has published), ``lastby`` (the
LastBy and SubscribeLastBy calls answered from them), ``metrics``, ``daemon``.
"""
