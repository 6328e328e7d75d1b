/*
 * Spark ML transform of a small dense network inside the JVM: a function over each
 * partition's rows, in Spark's internal row format.
 *
 * For a small network, handing each row to a Python worker and back costs more than the
 * arithmetic; so does a Java UDF's conversion of every Vector to an object and back
 * (measured: benchmarks/README.md, batch inference).  Here the features are read
 * straight from the row (a VectorUDT struct: type, size, indices, values) into one
 * reused buffer, and each input row goes out joined to a small row of outputs, which
 * Spark's scan copies into its own row format.
 *
 * Layout (written by sparknet/ml/_jvm.py):
 *   spec  "features index;mode;thresholds;outputs;features column name"
 *         mode 0 classifier, 1 regressor with one output (a double), 2 regressor with
 *         a vector output; thresholds ':'-separated, or empty; outputs the output
 *         fields in column order, ','-separated, of raw, prob, pred.
 */
package sparknet.jvm;

import java.io.Serializable;
import java.util.Arrays;
import java.util.Iterator;

import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.JoinedRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeArrayData;
import org.apache.spark.sql.catalyst.util.ArrayData;

public final class ScoreRows implements FlatMapFunction<Iterator<InternalRow>, InternalRow>, Serializable {
    private static final long serialVersionUID = 1L;
    private static final int RAW = 0, PROB = 1, PRED = 2;

    private DenseForward net;
    private int column;
    private String name;
    private int mode;
    private double[] thresholds;
    private int[] outputs;

    public ScoreRows() {}

    /** Set the network and read the spec (see the file comment); returns this. */
    public ScoreRows configure(DenseForward net, String spec) {
        String[] f = spec.split(";", 5);
        if (f.length != 5) throw new IllegalArgumentException("bad scoring spec: " + spec);
        this.net = net;
        column = Integer.parseInt(f[0]);
        mode = Integer.parseInt(f[1]);
        if (f[2].isEmpty()) {
            thresholds = null;
        } else {
            String[] t = f[2].split(":");
            thresholds = new double[t.length];
            for (int i = 0; i < t.length; i++) thresholds[i] = Double.parseDouble(t[i]);
        }
        String[] o = f[3].isEmpty() ? new String[0] : f[3].split(",");
        outputs = new int[o.length];
        for (int i = 0; i < o.length; i++) {
            outputs[i] = o[i].equals("raw") ? RAW : o[i].equals("prob") ? PROB : PRED;
        }
        name = f[4];
        return this;
    }

    /** A dense ML Vector in VectorUDT's internal layout. */
    static InternalRow vector(double[] v) {
        return new GenericInternalRow(new Object[]{(byte) 1, null, null,
                UnsafeArrayData.fromPrimitiveArray(v)});
    }

    private IllegalArgumentException bad(String what) {
        return new IllegalArgumentException("features column '" + name + "' " + what);
    }

    /** The row's features into x (checked: not null, the network's size, finite). */
    void read(InternalRow row, double[] x) {
        if (row.isNullAt(column)) throw bad("has a null row; fill or drop it first");
        InternalRow v = row.getStruct(column, 4);
        int n = x.length;
        if (v.getByte(0) == 1) {                       // dense
            ArrayData values = v.getArray(3);
            if (values.numElements() != n) {
                throw bad("has a row of " + values.numElements() + " values; the network expects " + n);
            }
            for (int i = 0; i < n; i++) x[i] = values.getDouble(i);
        } else {                                       // sparse
            if (v.getInt(1) != n) {
                throw bad("has a row of " + v.getInt(1) + " values; the network expects " + n);
            }
            Arrays.fill(x, 0.0);
            ArrayData indices = v.getArray(2), values = v.getArray(3);
            for (int i = 0; i < indices.numElements(); i++) x[indices.getInt(i)] = values.getDouble(i);
        }
        for (int i = 0; i < n; i++) {
            double xi = x[i];
            if (xi - xi != 0.0) throw bad("contains NaN or infinity (value " + i + " of a row)");
        }
    }

    /** MLlib's prediction: the argmax (first on ties) of the logits, or, with thresholds,
     *  of probability / threshold, a zero threshold winning outright. */
    double predict(double[] raw, double[] prob) {
        int best = 0;
        if (thresholds == null) {
            for (int j = 1; j < raw.length; j++) if (raw[j] > raw[best]) best = j;
            return best;
        }
        double bestScore = Double.NEGATIVE_INFINITY;
        for (int j = 0; j < prob.length; j++) {
            double s = thresholds[j] == 0.0 ? Double.POSITIVE_INFINITY : prob[j] / thresholds[j];
            if (s > bestScore) {
                bestScore = s;
                best = j;
            }
        }
        return best;
    }

    /** MLlib's rawPrediction of the logits: for two classes [-m, m] with the margin
     *  m = z1 - z0 (as its binary logistic regression), else the logits themselves
     *  (sparknet.ml._inference.raw_prediction). */
    static double[] rawPrediction(double[] out) {
        if (out.length != 2) return out;
        double m = out[1] - out[0];
        return new double[]{-m, m};
    }

    /** The output fields for one row of features. */
    Object[] score(double[] x) {
        double[] out = net.forward(x);
        if (mode != 0) {                               // a regressor: its prediction, if asked
            if (outputs.length == 0) return new Object[0];
            return new Object[]{mode == 1 ? (Object) out[0] : vector(out)};
        }
        double[] prob = null;
        for (int o : outputs) {
            if (o == PROB || (o == PRED && thresholds != null)) {
                prob = out.clone();
                DenseForward.softmax(prob, prob.length);
                break;
            }
        }
        Object[] fields = new Object[outputs.length];
        for (int i = 0; i < outputs.length; i++) {
            switch (outputs[i]) {
                case RAW: fields[i] = vector(rawPrediction(out)); break;
                case PROB: fields[i] = vector(prob); break;
                default: fields[i] = predict(out, prob);
            }
        }
        return fields;
    }

    @Override
    public Iterator<InternalRow> call(Iterator<InternalRow> rows) {
        final double[] x = new double[net.inputs()];
        final JoinedRow joined = new JoinedRow();
        return new Iterator<InternalRow>() {
            @Override
            public boolean hasNext() {
                return rows.hasNext();
            }

            @Override
            public InternalRow next() {
                InternalRow row = rows.next();
                read(row, x);
                // the scan copies the joined row before asking for the next one
                return joined.apply(row, new GenericInternalRow(score(x)));
            }
        };
    }
}
