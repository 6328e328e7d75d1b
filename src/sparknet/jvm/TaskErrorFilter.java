/*
 * Spark's console lines about a task that sparknet's own code failed, moved to the debug log.
 *
 * When a task raises one of sparknet's errors (a bad row while scoring, say), the driver gets
 * that error as itself (sparknet/cluster/engine/task_errors.py); Spark also logs the task's
 * trace two or three times on the driver's console: "Exception in task" (the executor, in
 * local mode), "Lost task" (the scheduler, for the failed task and for each one the failure
 * cancelled), then "Task N in stage S failed N times; aborting job".  This filter, added to
 * the driver's log4j2 configuration (install), drops those events from the console and logs
 * them at debug level under the logger "sparknet.tasks" instead.  Every other event passes
 * untouched: a task failure of any other code is logged as Spark logs it.
 *
 * A task failed in sparknet's code when its exception (or a cause) was thrown by a class of
 * this jar (sparknet.jvm.*), or when it is a Python worker's exception whose traceback ends in
 * one of sparknet.errors' classes (a Python worker's exception reaches the JVM as that text).
 */
package sparknet.jvm;

import java.util.ArrayDeque;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.apache.logging.log4j.Level;
import org.apache.logging.log4j.LogManager;
import org.apache.logging.log4j.Marker;
import org.apache.logging.log4j.core.Filter;
import org.apache.logging.log4j.core.LogEvent;
import org.apache.logging.log4j.core.Logger;
import org.apache.logging.log4j.core.LoggerContext;
import org.apache.logging.log4j.core.config.Configuration;
import org.apache.logging.log4j.core.filter.AbstractFilter;
import org.apache.logging.log4j.core.filter.CompositeFilter;
import org.apache.logging.log4j.message.Message;

public final class TaskErrorFilter extends AbstractFilter {
    /** The logger the dropped events go to, at debug level. */
    public static final String DEBUG_LOGGER = "sparknet.tasks";
    private static final Pattern STAGE = Pattern.compile("in stage (\\d+\\.\\d+)");
    private static final Pattern ABORT = Pattern.compile(
            "^Task \\d+ in stage (\\d+\\.\\d+) failed \\d+ times; aborting job");
    private static final int STAGES_KEPT = 64;

    private final org.apache.logging.log4j.Logger debug;
    /** The stages whose tasks failed in sparknet's code (the newest few). */
    private final ArrayDeque<String> stages = new ArrayDeque<>();

    private TaskErrorFilter(LoggerContext ctx) {
        super(Result.DENY, Result.NEUTRAL);
        debug = ctx.getLogger(DEBUG_LOGGER);
    }

    /** Add the filter to the configuration of Spark's loggers (once); true if added now. */
    public static synchronized boolean install() {
        LoggerContext ctx = (LoggerContext) LogManager.getContext(
                org.apache.spark.SparkContext.class.getClassLoader(), false);
        Configuration config = ctx.getConfiguration();
        if (installed(config.getFilter())) return false;
        TaskErrorFilter filter = new TaskErrorFilter(ctx);
        filter.start();
        config.addFilter(filter);
        ctx.updateLoggers();
        return true;
    }

    /** Whether f is (or holds) this filter, loaded by any class loader. */
    private static boolean installed(Filter f) {
        if (f == null) return false;
        if (f.getClass().getName().equals(TaskErrorFilter.class.getName())) return true;
        if (f instanceof CompositeFilter) {
            for (Filter g : ((CompositeFilter) f).getFiltersArray()) if (installed(g)) return true;
        }
        return false;
    }

    /** Whether t (or one of its causes) is an error of sparknet's code. */
    static boolean fromSparknet(Throwable t) {
        for (int depth = 0; t != null && depth < 16; depth++, t = t.getCause()) {
            StackTraceElement[] frames = t.getStackTrace();
            if (frames.length > 0 && frames[0].getClassName().startsWith("sparknet.jvm.")) return true;
            if (mentions(t.getMessage())) return true;
        }
        return false;
    }

    /** Whether a message carries a trace of sparknet's code or a Python sparknet error. */
    static boolean mentions(String text) {
        return text != null && (text.contains("\tat sparknet.jvm.") || text.contains("sparknet.errors."));
    }

    private Result decide(String logger, Level level, Object msg, Throwable t) {
        if (level == null || level.isLessSpecificThan(Level.INFO)) return Result.NEUTRAL;  // cheap
        if (logger == null || !logger.startsWith("org.apache.spark.")) return Result.NEUTRAL;
        String text = msg == null ? "" : msg instanceof Message
                ? ((Message) msg).getFormattedMessage() : msg.toString();
        if (mentions(text) || fromSparknet(t)) {
            Matcher m = STAGE.matcher(text);
            if (m.find()) remember(m.group(1));
            debug.debug("{} ({}: {})", text, logger, level, t);
            return Result.DENY;
        }
        Matcher m = ABORT.matcher(text);
        if (m.find() && seen(m.group(1))) {
            debug.debug("{} ({}: {})", text, logger, level);
            return Result.DENY;
        }
        return Result.NEUTRAL;
    }

    private synchronized void remember(String stage) {
        if (stages.contains(stage)) return;
        stages.addLast(stage);
        if (stages.size() > STAGES_KEPT) stages.removeFirst();
    }

    private synchronized boolean seen(String stage) {
        return stages.contains(stage);
    }

    @Override
    public Result filter(LogEvent event) {
        return decide(event.getLoggerName(), event.getLevel(), event.getMessage(), event.getThrown());
    }

    @Override
    public Result filter(Logger logger, Level level, Marker marker, Message msg, Throwable t) {
        return decide(logger.getName(), level, msg, t);
    }

    @Override
    public Result filter(Logger logger, Level level, Marker marker, Object msg, Throwable t) {
        return decide(logger.getName(), level, msg, t);
    }

    @Override
    public Result filter(Logger logger, Level level, Marker marker, String msg, Object... params) {
        Throwable t = params != null && params.length > 0 && params[params.length - 1] instanceof Throwable
                ? (Throwable) params[params.length - 1] : null;
        return decide(logger.getName(), level, msg, t);
    }
}
