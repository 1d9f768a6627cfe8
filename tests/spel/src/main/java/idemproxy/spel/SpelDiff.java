package idemproxy.spel;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.File;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.springframework.expression.AccessException;
import org.springframework.expression.EvaluationContext;
import org.springframework.expression.Expression;
import org.springframework.expression.ExpressionException;
import org.springframework.expression.PropertyAccessor;
import org.springframework.expression.TypedValue;
import org.springframework.expression.common.TemplateParserContext;
import org.springframework.expression.spel.standard.SpelExpressionParser;
import org.springframework.expression.spel.support.ReflectivePropertyAccessor;
import org.springframework.expression.spel.support.StandardEvaluationContext;

/**
 * Differential test of idemproxy's key templates (docs/configuration.md)
 * against real SpEL.
 *
 * <p>It reads the case table that tests/unit/test_template.c reads and evaluates
 * every case with spring-expression, the way a Spring application makes a key:
 * the event is the root object and the variables event, fields, stream and id
 * are set; a source that starts with '#' (but not "#{") is parsed as an
 * expression, anything else as a template with a {@link TemplateParserContext};
 * the value is read with {@code getValue(context, String.class)}. Events are
 * read by Jackson into Maps, Lists, Integers, Longs, BigIntegers and Doubles.
 *
 * <p>Two adaptations make SpEL see what idemproxy sees, and are not counted as
 * differences: a map property that is not there reads as null (SpEL's
 * {@code map['key']} rule, which docs/configuration.md applies to {@code
 * map.key} too, so the accessor below is used instead of spring-context's
 * stricter MapAccessor), and inside #{...} a bare variable name ({@code
 * event.x}) is rewritten to its SpEL spelling ({@code #event.x}).
 *
 * <p>A case without a "spel" entry must get from SpEL exactly what idemproxy
 * gives: the same text, or an error where idemproxy has one. A case with a
 * "spel" entry is a documented difference, and SpEL must do exactly what it
 * says ("gives": the text or null SpEL returns; "error": SpEL throws), so the
 * list of differences cannot go stale. Where idemproxy has an error, SpEL must
 * throw an ExpressionException (its verdict on the expression; a
 * StackOverflowError or any other crash fails the case), or exactly the class
 * a case names in "spel_throws". "na" cases (record accessors, which a
 * Map does not have) are not compared. The last line printed is
 * "N passed, N failed"; the exit status is 1 when anything failed.
 */
public final class SpelDiff {

    private static final Set<String> VARS = Set.of("event", "fields", "stream", "id", "root");

    /** Reads any property of a Map as map.get(name): missing keys are null. */
    static final class LenientMapAccessor implements PropertyAccessor {
        @Override
        public Class<?>[] getSpecificTargetClasses() {
            return new Class<?>[] {Map.class};
        }

        @Override
        public boolean canRead(EvaluationContext context, Object target, String name) {
            return target instanceof Map;
        }

        @Override
        public TypedValue read(EvaluationContext context, Object target, String name) {
            return new TypedValue(((Map<?, ?>) target).get(name));
        }

        @Override
        public boolean canWrite(EvaluationContext context, Object target, String name) {
            return false;
        }

        @Override
        public void write(EvaluationContext context, Object target, String name, Object value)
                throws AccessException {
            throw new AccessException("read-only");
        }
    }

    /**
     * What SpEL made of a case: text, null, or an error message. 'spelError'
     * says the error is SpEL's own verdict on the expression (a parse or
     * evaluation ExpressionException), not a crash of the evaluator (a
     * StackOverflowError, a NullPointerException), which no case accepts.
     */
    record Outcome(boolean error, boolean spelError, String text) {
        static Outcome value(String s) { return new Outcome(false, false, s); }
        static Outcome fail(Throwable ex) {
            String m = ex.getMessage();
            return new Outcome(true, ex instanceof ExpressionException,
                    ex.getClass().getSimpleName() + (m == null ? "" : ": " + m));
        }

        @Override
        public String toString() {
            if (error) return "error (" + text + ")";
            return text == null ? "null" : '"' + text + '"';
        }
    }

    private static final ObjectMapper JSON = new ObjectMapper();
    private static final SpelExpressionParser PARSER = new SpelExpressionParser();

    public static void main(String[] args) throws Exception {
        boolean show = false;
        String path = "../unit/template_cases.json";
        for (String a : args) {
            if (a.equals("--show")) show = true;
            else path = a;
        }
        JsonNode table = JSON.readTree(new File(path));
        JsonNode defaults = table.path("defaults");

        int passed = 0, failed = 0, na = 0, differences = 0;
        for (JsonNode c : table.get("cases")) {
            String name = c.get("name").asText();
            String src = c.get("src").asText();
            Outcome got = evaluate(src, var(c, defaults, "event"), var(c, defaults, "fields"),
                    var(c, defaults, "stream"), var(c, defaults, "id"));
            if (show) System.out.println(name + "\t" + src + "\t" + got);

            JsonNode spel = c.get("spel");
            String want;
            boolean ok;
            if (spel != null && spel.has("na")) {
                na++;
                continue;
            } else if (spel != null && spel.has("gives")) {
                JsonNode g = spel.get("gives");
                ok = !got.error() && (g.isNull() ? got.text() == null : g.asText().equals(got.text()));
                want = "documented difference: SpEL gives " + (g.isNull() ? "null" : '"' + g.asText() + '"');
                differences++;
            } else if (spel != null && spel.has("error")) {
                ok = got.spelError();
                want = "documented difference: SpEL fails (an ExpressionException)";
                differences++;
            } else if (c.has("expect")) {
                ok = !got.error() && c.get("expect").asText().equals(got.text());
                want = "\"" + c.get("expect").asText() + "\" as idemproxy";
            } else if (c.has("spel_throws")) {
                // SpEL fails with an exception of its evaluator, not an
                // ExpressionException: the case names the class it must be.
                String cls = c.get("spel_throws").asText();
                ok = got.error() && got.text().startsWith(cls + ":");
                want = "an error, as idemproxy (SpEL: " + cls + ")";
            } else {
                ok = got.spelError();
                want = "an error (an ExpressionException), as idemproxy";
            }
            if (spel != null && spel.path("why").asText().isEmpty()) {
                ok = false;
                want += " (and a 'why')";
            }
            if (ok) {
                passed++;
            } else {
                failed++;
                System.out.println("FAIL " + name + ": " + src + ": SpEL gave " + got + ", want " + want);
            }
        }
        System.out.println(differences + " documented differences checked, " + na
                + " cases not comparable (record accessors)");
        System.out.println(passed + " passed, " + failed + " failed");
        System.exit(failed == 0 ? 0 : 1);
    }

    /** The case's value for variable 'name', else the table's default, as Java objects. */
    private static Object var(JsonNode c, JsonNode defaults, String name) {
        JsonNode n = c.has(name) ? c.get(name) : defaults.get(name);
        if (n == null || n.isNull()) return null;
        return JSON.convertValue(n, Object.class);
    }

    private static Outcome evaluate(String src, Object event, Object fields, Object stream, Object id) {
        StandardEvaluationContext ctx = new StandardEvaluationContext(event);
        ctx.setPropertyAccessors(List.of(new LenientMapAccessor(), new ReflectivePropertyAccessor()));
        ctx.setVariable("event", event);
        ctx.setVariable("fields", fields);
        ctx.setVariable("stream", stream);
        ctx.setVariable("id", id);
        try {
            Expression e = src.startsWith("#") && !src.startsWith("#{")
                    ? PARSER.parseExpression(src)
                    : PARSER.parseExpression(sugar(src), new TemplateParserContext());
            return Outcome.value(e.getValue(ctx, String.class));
        } catch (Exception | StackOverflowError ex) {
            return Outcome.fail(ex);
        }
    }

    /**
     * Rewrite idemproxy's bare variables inside #{...} to SpEL's '#name': a
     * variable name that is not a property (after '.' or '?.') and not already
     * after '#'. String literals are copied as they are.
     */
    static String sugar(String src) {
        StringBuilder sb = new StringBuilder();
        int i = 0, n = src.length();
        while (i < n) {
            if (!src.startsWith("#{", i)) {
                sb.append(src.charAt(i++));
                continue;
            }
            sb.append("#{");
            i += 2;
            char prev = 0;
            while (i < n && src.charAt(i) != '}') {
                char ch = src.charAt(i);
                if (ch == '\'' || ch == '"') {
                    int j = i + 1;
                    while (j < n) {
                        if (src.charAt(j) == ch) {
                            if (j + 1 < n && src.charAt(j + 1) == ch) { j += 2; continue; }
                            break;
                        }
                        j++;
                    }
                    j = Math.min(j + 1, n);
                    sb.append(src, i, j);
                    i = j;
                    prev = ch;
                } else if (Character.isLetter(ch) || ch == '_' || ch == '$') {
                    int j = i;
                    while (j < n && (Character.isLetterOrDigit(src.charAt(j))
                            || src.charAt(j) == '_' || src.charAt(j) == '$')) j++;
                    String word = src.substring(i, j);
                    if (prev != '.' && prev != '#' && !Character.isDigit(prev) && VARS.contains(word)) sb.append('#');
                    sb.append(word);
                    i = j;
                    prev = 'a';
                } else {
                    if (!Character.isWhitespace(ch)) prev = ch;
                    sb.append(ch);
                    i++;
                }
            }
        }
        return sb.toString();
    }
}
