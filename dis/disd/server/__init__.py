"""The DIS daemon: gRPC services (Ingest, TableData, health, reflection) over the storage engine."""
