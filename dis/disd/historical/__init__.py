"""Historical storage: intraday column partitions merged into Parquet, in the seeds' layouts.

=====================  =======================================================================
module                 owns
=====================  =======================================================================
``layout``             every historical path: Systems and Users namespaces, locations, links
``definitions``        ``Definitions/<Table>.tbl``: a historical table's columns and layout
``durable``            temp + fsync + rename, version directories, atomic link switches, locks
``index``              a location's manifest and the table's ``MetadataIndex/<Table>.tlmi``
``publish``            from a writer's staging directory to a linked, indexed location
``intraday``           what a merge reads: the partition's intraday locations, pinned
``liveness``           the rule for "still being written"
``discover``           a table's Parquet files and row groups, in every layout
``merge``              ``dis merge``: the Spark job
=====================  =======================================================================

Reading is done by the ``dis`` Spark source (``disd.spark.ondisk``); user tables are written by
``disd.spark.write_user_table``.  The layout and the guarantees are in docs/historical.md.
"""
