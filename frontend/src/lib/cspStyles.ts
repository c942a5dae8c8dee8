// xterm's renderer writes its colours and cell sizes into <style> elements it
// creates under the terminal. The dashboard's Content-Security-Policy
// (style-src 'self', backend/core/csp.py) refuses inline styles, so a browser
// ignores those elements. A constructed stylesheet is not an inline style: the
// same rules are applied through one, kept in step with what xterm writes, and
// xterm's elements are taken out of the page (it keeps writing to them there).

/** Mirror the <style> elements under `root`, now and later, into an adopted stylesheet; returns the undo. */
export function adoptInlineStyles(root: HTMLElement): () => void {
  if (!constructedSheetsSupported()) return () => undefined;
  const sheet = new CSSStyleSheet();
  const styles = new Set<HTMLStyleElement>();
  const contents = new MutationObserver(() => sync());
  const additions = new MutationObserver(() => collect());

  const sync = () => sheet.replaceSync([...styles].map((style) => style.textContent ?? "").join("\n"));
  const collect = () => {
    for (const style of root.querySelectorAll("style")) {
      styles.add(style);
      contents.observe(style, { childList: true, characterData: true, subtree: true });
      style.remove();
    }
    sync();
  };

  document.adoptedStyleSheets = [...document.adoptedStyleSheets, sheet];
  collect();
  additions.observe(root, { childList: true, subtree: true });
  return () => {
    additions.disconnect();
    contents.disconnect();
    document.adoptedStyleSheets = document.adoptedStyleSheets.filter((s) => s !== sheet);
  };
}

function constructedSheetsSupported(): boolean {
  if (!("adoptedStyleSheets" in document)) return false;
  try {
    new CSSStyleSheet().replaceSync("");
    return true;
  } catch {
    return false;
  }
}
