/*
 * A partition's training rows written by the JVM to one local file, which the Python
 * worker beside it (always on the executor's host) reads whole.
 *
 * Handing a Vector column to Python through Arrow writes every element through Arrow's
 * per-value writers, then the socket to the worker: most of a first fit's set-up
 * (benchmarks/README.md, fit set-up).  Here each row's features are read straight from
 * Spark's internal row format (a VectorUDT struct: type, size, indices, values; or an
 * array of numbers) into a buffer of little-endian float32 or float64 values, written
 * to the file in large pieces, the float64 labels after them.
 *
 * Input rows: (features, label double).  Output: one row a partition, (path string,
 * rows int, dim int, bad string, seconds double: the time spent here).  The file holds rows x dim features, then rows labels.
 * The first bad row ends the partition: no file, and `bad` says what and where
 * ("x_null 12", "x_lengths 783 784 12", "y_null 12", rows counted within the partition),
 * which sparknet/cluster/data/sharding.py turns into a clear error.  The reader deletes the file;
 * the end of the task deletes it if the reader did not (a failed or killed task).
 *
 * Layout (written by sparknet/cluster/data/packed_rows.py):
 *   spec  "features kind;float bytes;folder"
 *         kind 0 ML Vector, 1 array of doubles, 2 array of floats; float bytes 4 or 8;
 *         folder the files' folder (empty: /dev/shm where writable, else java.io.tmpdir).
 */
package sparknet.jvm;

import java.io.File;
import java.io.IOException;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Arrays;
import java.util.Collections;
import java.util.Iterator;

import org.apache.spark.TaskContext;
import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.unsafe.types.UTF8String;
import org.apache.spark.util.TaskCompletionListener;

public final class PackRows implements FlatMapFunction<Iterator<InternalRow>, InternalRow>, Serializable {
    private static final long serialVersionUID = 1L;
    private static final int VECTOR = 0, DOUBLES = 1, FLOATS = 2;
    private static final int PIECE = 4 << 20;

    private int kind;
    private int width;
    private String folder;

    public PackRows() {}

    /** Read the spec (see the file comment); returns this. */
    public PackRows configure(String spec) {
        String[] f = spec.split(";", 3);
        if (f.length != 3) throw new IllegalArgumentException("bad packing spec: " + spec);
        kind = Integer.parseInt(f[0]);
        width = Integer.parseInt(f[1]);
        folder = f[2];
        if (kind < VECTOR || kind > FLOATS || (width != 4 && width != 8)) {
            throw new IllegalArgumentException("bad packing spec: " + spec);
        }
        return this;
    }

    /** The number of values in a row's features, or -1 for a null. */
    int length(InternalRow row) {
        if (row.isNullAt(0)) return -1;
        if (kind != VECTOR) return row.getArray(0).numElements();
        InternalRow v = row.getStruct(0, 4);
        return v.getByte(0) == 1 ? v.getArray(3).numElements() : v.getInt(1);
    }

    /** The row's features into x (its length checked by the caller). */
    void read(InternalRow row, double[] x) {
        if (kind == DOUBLES) {          // a null element reads as NaN, refused as the Arrow path does
            ArrayData a = row.getArray(0);
            for (int i = 0; i < x.length; i++) x[i] = a.isNullAt(i) ? Double.NaN : a.getDouble(i);
        } else if (kind == FLOATS) {
            ArrayData a = row.getArray(0);
            for (int i = 0; i < x.length; i++) x[i] = a.isNullAt(i) ? Double.NaN : a.getFloat(i);
        } else {
            InternalRow v = row.getStruct(0, 4);
            ArrayData values = v.getArray(3);
            if (v.getByte(0) == 1) {                   // dense
                for (int i = 0; i < x.length; i++) x[i] = values.getDouble(i);
            } else {                                   // sparse
                Arrays.fill(x, 0.0);
                ArrayData indices = v.getArray(2);
                for (int i = 0; i < indices.numElements(); i++) x[indices.getInt(i)] = values.getDouble(i);
            }
        }
    }

    private File dir() {
        if (!folder.isEmpty()) return new File(folder);
        File shm = new File("/dev/shm");
        return shm.isDirectory() && shm.canWrite() ? shm : new File(System.getProperty("java.io.tmpdir"));
    }

    private static InternalRow result(String path, long rows, int dim, String bad) {
        return new GenericInternalRow(new Object[]{path == null ? null : UTF8String.fromString(path),
                (int) rows, dim, bad == null ? null : UTF8String.fromString(bad), 0.0});
    }

    private static void drain(FileChannel ch, ByteBuffer buf) throws IOException {
        buf.flip();
        while (buf.hasRemaining()) ch.write(buf);
        buf.clear();
    }

    /** Write the rows to a new file; the result row (see the file comment). */
    InternalRow pack(Iterator<InternalRow> rows) throws IOException {
        File dir = dir();
        Files.createDirectories(dir.toPath());
        Path path = Files.createTempFile(dir.toPath(), "sparknet-rows-", ".bin");
        TaskContext task = TaskContext.get();
        if (task != null) {
            task.addTaskCompletionListener(new TaskCompletionListener() {
                @Override
                public void onTaskCompletion(TaskContext context) {
                    try {
                        Files.deleteIfExists(path);
                    } catch (IOException e) {
                        // the folder is gone: nothing to delete
                    }
                }
            });
        }
        boolean ok = false;
        try (FileChannel ch = FileChannel.open(path, StandardOpenOption.WRITE)) {
            ByteBuffer buf = null;
            double[] labels = new double[1024];
            double[] x = null;
            int dim = -1;
            long n = 0;
            while (rows.hasNext()) {
                InternalRow row = rows.next();
                int len = length(row);
                if (len < 0) return result(null, 0, 0, "x_null " + n);
                if (dim < 0) {
                    dim = len;
                    x = new double[dim];
                    buf = ByteBuffer.allocateDirect(Math.max(PIECE, dim * width)).order(ByteOrder.LITTLE_ENDIAN);
                } else if (len != dim) {
                    return result(null, 0, 0, "x_lengths " + Math.min(dim, len) + " " + Math.max(dim, len) + " " + n);
                }
                if (row.isNullAt(1)) return result(null, 0, 0, "y_null " + n);
                read(row, x);
                if (buf.remaining() < dim * width) drain(ch, buf);
                if (width == 4) {
                    for (int i = 0; i < dim; i++) buf.putFloat((float) x[i]);
                } else {
                    for (int i = 0; i < dim; i++) buf.putDouble(x[i]);
                }
                if (n == labels.length) labels = Arrays.copyOf(labels, labels.length * 2);
                labels[(int) n++] = row.getDouble(1);
            }
            if (buf == null) buf = ByteBuffer.allocateDirect(PIECE).order(ByteOrder.LITTLE_ENDIAN);
            for (int i = 0; i < n; i++) {
                if (buf.remaining() < 8) drain(ch, buf);
                buf.putDouble(labels[i]);
            }
            drain(ch, buf);
            ok = true;
            return result(path.toString(), n, Math.max(dim, 0), null);
        } finally {
            if (!ok) Files.deleteIfExists(path);
        }
    }

    @Override
    public Iterator<InternalRow> call(Iterator<InternalRow> rows) {
        try {
            long t0 = System.nanoTime();
            InternalRow out = pack(rows);
            out.setDouble(4, (System.nanoTime() - t0) * 1e-9);
            return Collections.singletonList(out).iterator();
        } catch (IOException e) {
            throw new UncheckedIOException("sparknet could not write a partition's rows to a local file", e);
        }
    }
}
