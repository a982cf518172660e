package disd.spark;

import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * {@code spark.read.format("dis")} and {@code spark.readStream.format("dis")} in the JVM: a Data
 * Source V2 reader that hands Spark columnar batches filled straight from the column files (over
 * the DIS's block endpoint, or from the files themselves with option {@code dbRoot}).
 *
 * <p>Spark resolves a short name through the JVM's {@code DataSourceRegister}s first and only
 * then through the data sources registered from Python, so with this jar on the classpath
 * {@code format("dis")} lands here.  Reads this reader does not do go to the Python source
 * ({@code disd.spark.source}, which {@code disd.spark.register} registers as {@code dis_python}):
 * option {@code reader} (or the session setting {@code spark.dis.reader}) {@code python},
 * option {@code view} other than {@code rows} (the last-by view, docs/lastby.md),
 * {@code source} historical or all, column files without a DIS, and a user schema that asks for a
 * type conversion other than an exact widening.
 */
public final class DisSource implements TableProvider, DataSourceRegister {
    private static final Logger LOG = LoggerFactory.getLogger(DisSource.class);
    /** The session setting that picks the reader for every read: jvm (default) or python. */
    public static final String READER_CONF = "spark.dis.reader";
    /** The Python source's name while this reader is {@code dis} ({@code disd.spark.jvm}). */
    public static final String PYTHON_NAME = "dis_python";

    private PythonDataSourceV2 python;
    private TableSchema lastSchema;
    private Map<String, String> lastSchemaOptions;

    @Override
    public String shortName() {
        return "dis";
    }

    @Override
    public boolean supportsExternalMetadata() {
        return true;
    }

    /** Why this read goes to the Python source, or null when the JVM reader does it. */
    static String whyPython(Map<String, String> options) {
        Map<String, String> o = lower(options);
        String reader = o.get("reader");
        String from = "option 'reader'";
        if (reader == null || reader.trim().isEmpty()) {
            reader = SQLConf.get().getConfString(READER_CONF, "jvm");
            from = "the session setting " + READER_CONF;
        }
        reader = reader.trim().toLowerCase(Locale.ROOT);
        if (!reader.equals("jvm") && !reader.equals("python")) {
            throw new DisSourceError(from + " must be 'jvm' or 'python', got '" + reader + "'");
        }
        if (reader.equals("python")) {
            return from + " is 'python'";
        }
        String view = o.getOrDefault("view", "rows").trim().toLowerCase(Locale.ROOT);
        if (!view.equals("rows")) {
            return "option 'view' is '" + view + "' (the last-by view is read by the Python source)";
        }
        String source = o.getOrDefault("source", "intraday").trim().toLowerCase(Locale.ROOT);
        if (source.equals("historical") || source.equals("all")) {
            return "option 'source' is '" + source + "' (historical Parquet files are read by the Python source)";
        }
        boolean dis = !blank(o.get("address")) || !blank(o.get("routing"));
        if (!dis && !blank(o.get("dbroot"))) {
            return "option 'dbRoot' without 'address' or 'routing' reads the column files at their checkpoints "
                + "(the Python source)";
        }
        return null;
    }

    private static boolean blank(String s) {
        return s == null || s.trim().isEmpty();
    }

    private static Map<String, String> lower(Map<String, String> options) {
        Map<String, String> out = new HashMap<>();
        for (Map.Entry<String, String> e : options.entrySet()) {
            out.put(e.getKey().toLowerCase(Locale.ROOT), e.getValue());
        }
        return out;
    }

    private PythonDataSourceV2 python(String why) {
        LOG.info("dis: the Python source reads this: {}", why);
        if (python == null) {
            python = new PythonDataSourceV2();
            python.setShortName(PYTHON_NAME);
        }
        return python;
    }

    private static RuntimeException pythonFailed(RuntimeException e) {
        String m = String.valueOf(e.getMessage());
        if (m.contains("DATA_SOURCE_NOT_FOUND") || m.contains("not found")) {
            return new DisSourceError("this read needs the Python source, which is not registered in this session: "
                + "call disd.spark.register(spark)", e);
        }
        return e;
    }

    private TableSchema schemaOf(DisOptions o, Map<String, String> options) {
        Map<String, String> key = lower(options);
        if (lastSchema != null && key.equals(lastSchemaOptions)) {
            return lastSchema;
        }
        lastSchema = new Dis(o).schema();
        lastSchemaOptions = key;
        return lastSchema;
    }

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        String why = whyPython(options);
        if (why != null) {
            try {
                return python(why).inferSchema(options);
            } catch (RuntimeException e) {
                throw pythonFailed(e);
            }
        }
        DisOptions o = DisOptions.parse(options);
        return schemaOf(o, options).sparkSchema(o.columns);
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        String why = whyPython(properties);
        if (why == null) {
            DisOptions o = DisOptions.parse(properties);
            TableSchema t = schemaOf(o, properties);
            Projection p = Projection.of(t, schema);
            if (p != null) {
                checkColumns(o, p);
                return new DisTable(o, p);
            }
            why = "the schema asks for a type conversion the JVM reader does not do (Arrow casts it)";
        }
        try {
            return python(why).getTable(schema, partitioning, properties);
        } catch (RuntimeException e) {
            throw pythonFailed(e);
        }
    }

    private static void checkColumns(DisOptions o, Projection p) {
        if (o.columns == null) {
            return;
        }
        StringBuilder asked = new StringBuilder();
        StringBuilder got = new StringBuilder();
        List<String> cols = o.columns;
        for (String c : cols) {
            asked.append(asked.length() == 0 ? "" : ", ").append(c);
        }
        for (Projection.Output out : p.outputs) {
            got.append(got.length() == 0 ? "" : ", ").append(out.name);
        }
        if (!asked.toString().toLowerCase(Locale.ROOT).equals(got.toString().toLowerCase(Locale.ROOT))) {
            throw new DisSourceError("option 'columns' (" + asked + ") differs from the schema given with .schema(...) ("
                + got + "); give one of them");
        }
    }
}
