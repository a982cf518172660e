package disd.spark;

import java.util.EnumSet;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.Column;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownFilters;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * A DIS table as Spark sees it: batch and micro-batch reads.  Each query gets a new ScanBuilder,
 * so the columns it needs and its partition filters decide what that query alone reads.
 */
final class DisTable implements SupportsRead {
    final DisOptions options;
    final Projection projection;

    DisTable(DisOptions options, Projection projection) {
        this.options = options;
        this.projection = projection;
    }

    @Override
    public String name() {
        return "dis " + projection.table.key();
    }

    @Override
    public Column[] columns() {
        StructType s = projection.sparkSchema();
        Column[] out = new Column[s.fields().length];
        for (int i = 0; i < out.length; i++) {
            StructField f = s.fields()[i];
            out[i] = Column.create(f.name(), f.dataType(), f.nullable());
        }
        return out;
    }

    @Override
    @SuppressWarnings("deprecation")
    public StructType schema() {
        return projection.sparkSchema();
    }

    @Override
    public Set<TableCapability> capabilities() {
        return EnumSet.of(TableCapability.BATCH_READ, TableCapability.MICRO_BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap ignored) {
        return new Builder();
    }

    final class Builder implements SupportsPushDownRequiredColumns, SupportsPushDownFilters {
        Projection pruned = projection;
        final PartitionFilters filters = new PartitionFilters(projection.partitionName());

        @Override
        public void pruneColumns(StructType required) {
            pruned = projection.prune(required);
        }

        /** Filters on the partition column prune locations; all of them stay for Spark to apply. */
        @Override
        public Filter[] pushFilters(Filter[] offered) {
            filters.offer(offered);
            return offered;
        }

        @Override
        public Filter[] pushedFilters() {
            return filters.pushed();
        }

        @Override
        public Scan build() {
            return new DisScan(options, pruned, filters, SQLConf.get().offHeapColumnVectorEnabled());
        }
    }
}
