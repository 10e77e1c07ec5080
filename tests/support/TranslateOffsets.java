// MirrorMaker 2's own client reading checkpoints: java -cp <kafka classpath> TranslateOffsets.java PROPS ALIAS GROUP...
// Prints one line per partition: group <TAB> topic <TAB> partition <TAB> offset.
import java.io.FileReader;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.connect.mirror.RemoteClusterUtils;

public class TranslateOffsets {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        try (FileReader reader = new FileReader(args[0])) {
            props.load(reader);
        }
        Map<String, Object> config = new HashMap<>();
        props.forEach((k, v) -> config.put((String) k, v));
        for (int i = 2; i < args.length; i++) {
            var offsets = RemoteClusterUtils.translateOffsets(config, args[1], args[i], Duration.ofSeconds(60));
            for (var entry : offsets.entrySet()) {
                var tp = entry.getKey();
                System.out.println(args[i] + "\t" + tp.topic() + "\t" + tp.partition() + "\t" + entry.getValue().offset());
            }
        }
    }
}
