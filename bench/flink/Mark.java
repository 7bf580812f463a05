// The Flink side's probe and fault hook (bench/flink_side_by_side.py compiles it with javac at run time).
// Applied to the aggregate's output rows, so it runs in the stateful task, like the provider's foreachBatch sink.
// For keys starting with "probe": if the file FAULT_DIR/task (the job parameter bench.fault.dir) exists, delete it, write task.fired (epoch ms) and
// throw (an injected task failure, fired once); otherwise write FAULT_DIR/seen-<key> (epoch ms): the probe's row
// was aggregated and emitted. Other keys pass untouched (one startsWith per row).
import java.io.File;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;

import org.apache.flink.table.functions.FunctionContext;
import org.apache.flink.table.functions.ScalarFunction;

public class Mark extends ScalarFunction {
    private File dir;

    @Override
    public void open(FunctionContext context) {
        dir = new File(context.getJobParameter("bench.fault.dir", "/nonexistent"));
    }

    public String eval(String key) throws Exception {
        if (key != null && key.startsWith("probe")) {
            long now = System.currentTimeMillis();
            if (new File(dir, "task").delete()) {
                write("task.fired", now + " " + key);
                throw new RuntimeException("injected task failure at " + key);
            }
            write("seen-" + key, Long.toString(now));
        }
        return key;
    }

    private void write(String name, String text) throws Exception {
        File tmp = new File(dir, "." + name + ".tmp");
        Files.writeString(tmp.toPath(), text);
        Files.move(tmp.toPath(), new File(dir, name).toPath(), StandardCopyOption.REPLACE_EXISTING);
    }

    @Override
    public boolean isDeterministic() {
        return false;
    }
}
