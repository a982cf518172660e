"""Historical storage: intraday column partitions merged into Parquet, in the seeds' layouts.

=====================  =======================================================================
module                 owns
=====================  =======================================================================
``layout``             every historical path: Systems and Users namespaces, locations, links
``definitions``        ``Definitions/<Table>.tbl``: a historical table's columns and layout
``durable``            temp + fsync + rename, version directories, atomic link switches, locks
``index``              a location's manifest and the table's ``MetadataIndex/<Table>.tlmi``
``publish``            from a writer's staging directory to a linked, indexed location
``parquet``            the one Parquet writer settings of merges and user tables
``usertables``         user tables: names, definition, lock, staging and publishing
``intraday``           what a merge reads: the partition's intraday locations, pinned
``liveness``           the rule for "still being written"
``discover``           a table's Parquet files and row groups, in every layout
``scan``               scan planning: tasks per scan, row groups per task
``merge``              the merge job (``dis merge``'s command line is ``disd.merge_job``)
=====================  =======================================================================

Nothing here imports ``disd.spark``: the ``dis`` Spark source reads historical tables
(``disd.spark.ondisk``) and writes user tables (``disd.spark.write_user_table``) on top of this
package, and a merge reads through that source by its name.  The layout and the guarantees are
in docs/historical.md.
"""
