/*
 * The forward pass of a small dense network, one row at a time, inside the JVM
 * (ScoreRows.java runs it over a DataFrame's rows).
 *
 * Layout (written by sparknet/ml/_jvm.py):
 *   spec   "inputs;op,op,..."; each op "d<units>:<act>" (dense then activation) or
 *          "a<act>" (activation alone); act 0 identity, 1 relu, 2 tanh, 3 sigmoid,
 *          4 softmax.
 *   params float64, little-endian: for each dense op its kernel as [in][out] rows
 *          (the transpose of sparknet's (units, in) kernel), then its bias.
 *
 * The kernel is stored by input neuron so that each input adds a scaled row to the
 * outputs: a loop of one store and loads with the same index, which the JIT
 * vectorises (a dot-product loop, or one flat array with offsets, it does not); four
 * inputs go into each pass over the outputs, and groups of four zero inputs (ReLU
 * outputs, blank pixels) are skipped.
 */
package sparknet.jvm;

import java.io.Serializable;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.DoubleBuffer;

public final class DenseForward implements Serializable {
    private static final long serialVersionUID = 1L;

    private int inputs;
    private int[] units;        // per op: output width (dense) or -1 (activation alone)
    private int[] acts;         // per op: activation id
    private double[][][] rows;  // per dense op: [in][out]
    private double[][] bias;    // per dense op: [out]
    private transient double[][] scratch;

    public DenseForward() {}

    /** Read the spec and the parameters (see the file comment); returns this. */
    public DenseForward configure(String spec, byte[] params) {
        String[] f = spec.split(";", -1);
        if (f.length != 2) throw new IllegalArgumentException("bad network spec: " + spec);
        inputs = Integer.parseInt(f[0]);
        String[] ops = f[1].split(",");
        units = new int[ops.length];
        acts = new int[ops.length];
        rows = new double[ops.length][][];
        bias = new double[ops.length][];
        DoubleBuffer buf = ByteBuffer.wrap(params).order(ByteOrder.LITTLE_ENDIAN).asDoubleBuffer();
        int width = inputs;
        for (int k = 0; k < ops.length; k++) {
            String op = ops[k];
            if (op.charAt(0) == 'd') {
                int colon = op.indexOf(':');
                int out = Integer.parseInt(op.substring(1, colon));
                units[k] = out;
                acts[k] = Integer.parseInt(op.substring(colon + 1));
                double[][] w = new double[width][out];
                for (int i = 0; i < width; i++) buf.get(w[i]);
                double[] b = new double[out];
                buf.get(b);
                rows[k] = w;
                bias[k] = b;
                width = out;
            } else {
                units[k] = -1;
                acts[k] = Integer.parseInt(op.substring(1));
            }
        }
        if (buf.remaining() != 0) {
            throw new IllegalArgumentException(buf.remaining() + " parameters left over after " + spec);
        }
        return this;
    }

    /** Values per input row. */
    public int inputs() { return inputs; }

    private double[] buffer(int k, int n) {
        if (scratch == null) scratch = new double[units.length][];
        double[] s = scratch[k];
        if (s == null || s.length != n) scratch[k] = s = new double[n];
        return s;
    }

    /** The network's outputs for one row of inputs (a fresh array). */
    public double[] forward(double[] x) {
        double[] cur = x;
        int width = x.length;
        int last = units.length - 1;
        for (int k = 0; k <= last; k++) {
            double[] out;
            if (units[k] >= 0) {
                int n = units[k];
                out = k == last ? new double[n] : buffer(k, n);
                System.arraycopy(bias[k], 0, out, 0, n);
                double[][] w = rows[k];
                int i = 0;
                for (; i + 4 <= width; i += 4) {       // four inputs per pass over out
                    double x0 = cur[i], x1 = cur[i + 1], x2 = cur[i + 2], x3 = cur[i + 3];
                    if (x0 == 0.0 && x1 == 0.0 && x2 == 0.0 && x3 == 0.0) continue;
                    double[] w0 = w[i], w1 = w[i + 1], w2 = w[i + 2], w3 = w[i + 3];
                    for (int j = 0; j < n; j++) {
                        out[j] += x0 * w0[j] + x1 * w1[j] + x2 * w2[j] + x3 * w3[j];
                    }
                }
                for (; i < width; i++) {
                    double xi = cur[i];
                    if (xi == 0.0) continue;
                    double[] wi = w[i];
                    for (int j = 0; j < n; j++) out[j] += xi * wi[j];
                }
                width = n;
            } else {
                out = k == last ? new double[width] : buffer(k, width);
                System.arraycopy(cur, 0, out, 0, width);
            }
            activate(acts[k], out, width);
            cur = out;
        }
        return cur == x ? x.clone() : cur;
    }

    static void activate(int act, double[] v, int n) {
        switch (act) {
            case 0:
                return;
            case 1:
                for (int j = 0; j < n; j++) if (v[j] < 0.0) v[j] = 0.0;
                return;
            case 2:
                for (int j = 0; j < n; j++) v[j] = Math.tanh(v[j]);
                return;
            case 3:
                for (int j = 0; j < n; j++) {
                    double z = v[j];
                    if (z >= 0) {
                        v[j] = 1.0 / (1.0 + Math.exp(-z));
                    } else {
                        double e = Math.exp(z);
                        v[j] = e / (1.0 + e);
                    }
                }
                return;
            case 4:
                softmax(v, n);
                return;
            default:
                throw new IllegalArgumentException("unknown activation id " + act);
        }
    }

    static void softmax(double[] v, int n) {
        double m = Double.NEGATIVE_INFINITY;
        for (int j = 0; j < n; j++) if (v[j] > m) m = v[j];
        double s = 0.0;
        for (int j = 0; j < n; j++) {
            v[j] = Math.exp(v[j] - m);
            s += v[j];
        }
        for (int j = 0; j < n; j++) v[j] /= s;
    }
}
