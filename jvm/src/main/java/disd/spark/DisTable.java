package disd.spark;

import java.util.EnumSet;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.Column;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.expressions.aggregate.Aggregation;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownAggregates;
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

    final class Builder implements SupportsPushDownRequiredColumns, SupportsPushDownFilters,
        SupportsPushDownAggregates {
        Projection pruned = projection;
        final PartitionFilters filters = new PartitionFilters(projection.partitionName());
        AggPlan aggregation;

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

        /** Partial only: Spark aggregates the partial rows again (and splits AVG into SUM and COUNT). */
        @Override
        public boolean supportCompletePushDown(Aggregation a) {
            return false;
        }

        /**
         * Push {@code a} into the scan when this reader computes every part of it exactly
         * ({@link AggPlan#of}) and option {@code pushAggregates} is not false.  Spark offers
         * aggregates only to batch scans with no filter left for it to apply after the scan.
         */
        @Override
        public boolean pushAggregation(Aggregation a) {
            if (!options.pushAggregates) {
                return false;
            }
            aggregation = AggPlan.of(projection, a, SQLConf.get().ansiEnabled());
            return aggregation != null;
        }

        @Override
        public Scan build() {
            DisScan rows = new DisScan(options, aggregation != null ? aggregation.input : pruned, filters,
                SQLConf.get().offHeapColumnVectorEnabled());
            return aggregation != null ? new AggScan(rows, aggregation) : rows;
        }
    }
}
