"""The tailer: watches binary log directories and streams them to the DIS over gRPC."""
