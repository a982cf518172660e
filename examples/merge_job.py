"""``dis merge`` as a spark-submit application: one column partition into historical Parquet.

    PYSPARK_PYTHON=/path/to/venv/bin/python spark-submit --master spark://host:7077 \
        examples/merge_job.py --namespace Market --table Trade --partition 2026-11-21 \
        --db-root /shared/db --address dis-host:22021 --sort-by Sym,Timestamp

Takes the arguments of ``dis merge`` (``dis merge --help``).  The master and the executors'
settings are spark-submit's; every executor needs ``disd`` installed (the same venv, or
``--py-files``) and the database root mounted at the same path (the merge writes the staging
files from the executors and renames them on the driver).  Exit status: 0 merged (or already
merged), 3 the partition is still being written (``--force`` merges it anyway), 1 any other error.
See docs/historical.md.
"""

import sys

from disd.merge_job import main

if __name__ == "__main__":
    sys.exit(main())
