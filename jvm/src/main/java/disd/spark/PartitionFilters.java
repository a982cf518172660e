package disd.spark;

import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.sources.And;
import org.apache.spark.sql.sources.EqualNullSafe;
import org.apache.spark.sql.sources.EqualTo;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.sources.GreaterThan;
import org.apache.spark.sql.sources.GreaterThanOrEqual;
import org.apache.spark.sql.sources.In;
import org.apache.spark.sql.sources.IsNotNull;
import org.apache.spark.sql.sources.IsNull;
import org.apache.spark.sql.sources.LessThan;
import org.apache.spark.sql.sources.LessThanOrEqual;
import org.apache.spark.sql.sources.Not;
import org.apache.spark.sql.sources.Or;
import org.apache.spark.sql.sources.StringContains;
import org.apache.spark.sql.sources.StringEndsWith;
import org.apache.spark.sql.sources.StringStartsWith;

/**
 * Partition pruning by a query's WHERE clause: the filters Spark offers that say something about
 * the partition column decide, per location, whether any of its rows can match.  Every filter is
 * still applied by Spark to the rows read, so pruning only ever skips locations whose rows could
 * not have passed.  A query plans its own scan (a new ScanBuilder each time), so a pruned query
 * never changes what a later query on the same DataFrame reads.
 */
final class PartitionFilters implements Serializable {
    private static final long serialVersionUID = 1L;

    final String column;
    final List<Filter> used = new ArrayList<>();

    PartitionFilters(String column) {
        this.column = column;
    }

    /** Keep the filters that can prune (those that refer to the partition column at all). */
    void offer(Filter[] filters) {
        for (Filter f : filters) {
            if (refersTo(f)) {
                used.add(f);
            }
        }
    }

    private boolean refersTo(Filter f) {
        for (String r : f.references()) {
            if (r.equals(column)) {
                return true;
            }
        }
        return false;
    }

    /** False when no row of a location with this partition value can pass every used filter. */
    boolean admits(String value) {
        for (Filter f : used) {
            if (eval(f, value) == Boolean.FALSE) {
                return false;
            }
        }
        return true;
    }

    /** TRUE, FALSE, or null when the filter depends on other columns. */
    private Boolean eval(Filter f, String v) {
        if (f instanceof And) {
            Boolean l = eval(((And) f).left(), v);
            Boolean r = eval(((And) f).right(), v);
            if (l == Boolean.FALSE || r == Boolean.FALSE) {
                return false;
            }
            return l == null || r == null ? null : true;
        }
        if (f instanceof Or) {
            Boolean l = eval(((Or) f).left(), v);
            Boolean r = eval(((Or) f).right(), v);
            if (l == Boolean.TRUE || r == Boolean.TRUE) {
                return true;
            }
            return l == null || r == null ? null : false;
        }
        if (f instanceof Not) {
            Boolean c = eval(((Not) f).child(), v);
            return c == null ? null : !c;
        }
        if (f instanceof EqualTo && mine(((EqualTo) f).attribute())) {
            return cmp(v, ((EqualTo) f).value(), 0);
        }
        if (f instanceof EqualNullSafe && mine(((EqualNullSafe) f).attribute())) {
            Object x = ((EqualNullSafe) f).value();
            return x == null ? Boolean.FALSE : cmp(v, x, 0);
        }
        if (f instanceof In && mine(((In) f).attribute())) {
            boolean unknown = false;
            for (Object x : ((In) f).values()) {
                Boolean b = cmp(v, x, 0);
                if (b == Boolean.TRUE) {
                    return true;
                }
                unknown |= b == null;
            }
            return unknown ? null : false;
        }
        if (f instanceof GreaterThan && mine(((GreaterThan) f).attribute())) {
            return cmp(v, ((GreaterThan) f).value(), 1);
        }
        if (f instanceof GreaterThanOrEqual && mine(((GreaterThanOrEqual) f).attribute())) {
            return cmp(v, ((GreaterThanOrEqual) f).value(), 2);
        }
        if (f instanceof LessThan && mine(((LessThan) f).attribute())) {
            return cmp(v, ((LessThan) f).value(), -1);
        }
        if (f instanceof LessThanOrEqual && mine(((LessThanOrEqual) f).attribute())) {
            return cmp(v, ((LessThanOrEqual) f).value(), -2);
        }
        if (f instanceof IsNull && mine(((IsNull) f).attribute())) {
            return false; // the partition column is never null
        }
        if (f instanceof IsNotNull && mine(((IsNotNull) f).attribute())) {
            return true;
        }
        if (f instanceof StringStartsWith && mine(((StringStartsWith) f).attribute())) {
            return v.startsWith(((StringStartsWith) f).value());
        }
        if (f instanceof StringEndsWith && mine(((StringEndsWith) f).attribute())) {
            return v.endsWith(((StringEndsWith) f).value());
        }
        if (f instanceof StringContains && mine(((StringContains) f).attribute())) {
            return v.contains(((StringContains) f).value());
        }
        return null;
    }

    private boolean mine(String attribute) {
        return column.equals(attribute);
    }

    /** v op x for op 0 (=), 1 (&gt;), 2 (&gt;=), -1 (&lt;), -2 (&lt;=); strings compare as Spark's
     *  UTF8String (unsigned bytes); null (unknown) for a value that is not a string. */
    private static Boolean cmp(String v, Object x, int op) {
        if (x == null) {
            return false; // comparisons with NULL are never true
        }
        if (!(x instanceof String) && !(x instanceof org.apache.spark.unsafe.types.UTF8String)) {
            return null;
        }
        int c = compare(v.getBytes(StandardCharsets.UTF_8), x.toString().getBytes(StandardCharsets.UTF_8));
        switch (op) {
            case 0: return c == 0;
            case 1: return c > 0;
            case 2: return c >= 0;
            case -1: return c < 0;
            default: return c <= 0;
        }
    }

    private static int compare(byte[] a, byte[] b) {
        int n = Math.min(a.length, b.length);
        for (int i = 0; i < n; i++) {
            int d = (a[i] & 0xff) - (b[i] & 0xff);
            if (d != 0) {
                return d;
            }
        }
        return a.length - b.length;
    }

    Filter[] pushed() {
        return used.toArray(new Filter[0]);
    }
}
