/**
 * Pretty-prints JSON text by re-indenting its tokens, never by parsing and
 * re-serialising: numbers keep their exact text (`0.0` stays `0.0`, integers
 * beyond 2^53 keep every digit), as do strings and their escapes.
 * Returns null when the text is not valid JSON.
 */
export function formatJson(text: string, indent = 2): string | null {
  try {
    JSON.parse(text);
  } catch {
    return null;
  }
  const pad = (depth: number) => "\n" + " ".repeat(depth * indent);
  let out = "";
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const ch = text[i];
    if (inString) {
      out += ch;
      if (ch === "\\") {
        out += text[++i];
      } else if (ch === '"') {
        inString = false;
      }
      continue;
    }
    if (ch === '"') {
      inString = true;
      out += ch;
    } else if (ch === "{" || ch === "[") {
      const close = ch === "{" ? "}" : "]";
      const next = text.slice(i + 1).trimStart()[0];
      if (next === close) {
        out += ch + close; // an empty object or array stays on one line
        i = text.indexOf(close, i + 1);
      } else {
        depth++;
        out += ch + pad(depth);
      }
    } else if (ch === "}" || ch === "]") {
      depth--;
      out += pad(depth) + ch;
    } else if (ch === ",") {
      out += "," + pad(depth);
    } else if (ch === ":") {
      out += ": ";
    } else if (!/\s/.test(ch)) {
      out += ch;
    }
  }
  return out;
}
