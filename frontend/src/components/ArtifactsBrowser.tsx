// Each job's artifacts as a folder tree built from the file paths, with a
// preview pane (text, JSON, CSV, logs: at most PREVIEW_CAP bytes; images: at
// most IMAGE_CAP). Previews read the file's bytes with fetch: storage answers
// every file as an octet-stream download (never rendered on our origin), so
// an image is shown from a blob of its bytes typed by its extension.
import { useEffect, useMemo, useState } from "react";
import type { Artifact, ArtifactExport, ArtifactFile, Job } from "../api/types";
import { humanBytes, shortHash } from "../lib/format";
import { AnsiText } from "./ansi";
import { CopyButton, EmptyState } from "./ui";
import { formatJson } from "../lib/jsonFormat";

export const PREVIEW_CAP = 1024 * 1024;
export const IMAGE_CAP = 20 * 1024 * 1024;

export interface FileNode {
  kind: "file";
  name: string;
  path: string;
  file: ArtifactFile;
}

export interface DirNode {
  kind: "dir";
  name: string;
  /** "" for the artifact's root, else "a/b/". */
  path: string;
  size: number;
  children: TreeNode[];
}

export type TreeNode = FileNode | DirNode;

/** Folders from "a/b/c.txt"-style paths; folders first, then files, by name. */
export function buildTree(files: ArtifactFile[]): DirNode {
  const root: DirNode = { kind: "dir", name: "", path: "", size: 0, children: [] };
  for (const file of files) {
    const parts = file.path.replace(/^\.?\/+/, "").split("/").filter(Boolean);
    let dir = root;
    parts.slice(0, -1).forEach((part, depth) => {
      const path = `${parts.slice(0, depth + 1).join("/")}/`;
      let next = dir.children.find((c): c is DirNode => c.kind === "dir" && c.name === part);
      if (!next) {
        next = { kind: "dir", name: part, path, size: 0, children: [] };
        dir.children.push(next);
      }
      dir = next;
    });
    dir.children.push({ kind: "file", name: parts[parts.length - 1] ?? file.path, path: file.path, file });
  }
  sortAndSize(root);
  return root;
}

export function fileUrl(workspace: string, artifact: string, path: string): string {
  const encoded = path.split("/").map(encodeURIComponent).join("/");
  return `/api/v1/workspaces/${encodeURIComponent(workspace)}/artifacts/${artifact}/files/${encoded}`;
}

export function archiveUrl(workspace: string, artifact: string, prefix = ""): string {
  const base = `/api/v1/workspaces/${encodeURIComponent(workspace)}/artifacts/${artifact}/archive/`;
  return prefix ? `${base}?prefix=${encodeURIComponent(prefix)}` : base;
}

/** "copied", "copying", "pending", "failed: <reason>, retrying" or "failed: <reason>". */
export function exportState(exp: ArtifactExport): string {
  if (exp.status === "done") return "copied";
  if (exp.status === "failed") return `failed: ${exp.error || "no reason recorded"}`;
  if (exp.error) return `failed: ${exp.error}, retrying`;
  return exp.status;
}

interface Selection {
  artifact: Artifact;
  file: ArtifactFile;
}

export function ArtifactsBrowser({
  workspace,
  artifacts,
  jobs,
}: {
  workspace: string;
  artifacts: Artifact[];
  jobs: Job[];
}) {
  const [selected, setSelected] = useState<Selection | null>(null);
  const jobNames = new Map(jobs.map((j) => [j.id, j.name]));
  const byJob = new Map<string, Artifact[]>();
  for (const artifact of artifacts) {
    const list = byJob.get(artifact.job) ?? [];
    list.push(artifact);
    byJob.set(artifact.job, list);
  }
  if (!artifacts.length) {
    return (
      <EmptyState title="No artifacts">
        <p className="muted">
          Jobs save artifacts by listing paths under <code>artifacts:</code> in the workflow file.
        </p>
      </EmptyState>
    );
  }
  return (
    <div className="artifacts">
      <div className="artifact-tree" aria-label="Artifact files">
        {[...byJob.entries()].map(([job, list]) => (
          <section key={job} className="artifact-job">
            <h3>{jobNames.get(job) ?? job}</h3>
            {list.map((artifact) => (
              <ArtifactTree
                key={artifact.id}
                workspace={workspace}
                artifact={artifact}
                selected={selected}
                onSelect={(file) => setSelected({ artifact, file })}
              />
            ))}
          </section>
        ))}
      </div>
      <div className="artifact-preview" aria-label="Preview" role="region">
        {selected ? (
          <Preview workspace={workspace} artifact={selected.artifact} file={selected.file} />
        ) : (
          <p className="muted preview-hint">Select a file to preview it.</p>
        )}
      </div>
    </div>
  );
}

function ArtifactTree({
  workspace,
  artifact,
  selected,
  onSelect,
}: {
  workspace: string;
  artifact: Artifact;
  selected: Selection | null;
  onSelect: (file: ArtifactFile) => void;
}) {
  const tree = useMemo(() => buildTree(artifact.files), [artifact.files]);
  return (
    <div className="artifact">
      <div className="tree-row artifact-head">
        <span className="mono">{artifact.path}</span>
        {artifact.status !== "complete" ? <span className="badge badge-pending">{artifact.status}</span> : null}
        <span className="size">{humanBytes(artifact.total_size)}</span>
        <a className="btn btn-small" href={archiveUrl(workspace, artifact.id)} download>
          Download all
        </a>
      </div>
      {artifact.export ? (
        <div className={`tree-row artifact-export export-${artifact.export.status}`} title={artifact.export.error || undefined}>
          <span className="mono">→ {artifact.export.destination}</span> <span className="muted">({exportState(artifact.export)})</span>
        </div>
      ) : null}
      <ul className="tree">
        {tree.children.map((node) => (
          <TreeItem key={node.path} node={node} workspace={workspace} artifact={artifact} selected={selected} onSelect={onSelect} />
        ))}
      </ul>
    </div>
  );
}

function TreeItem({
  node,
  workspace,
  artifact,
  selected,
  onSelect,
}: {
  node: TreeNode;
  workspace: string;
  artifact: Artifact;
  selected: Selection | null;
  onSelect: (file: ArtifactFile) => void;
}) {
  const [open, setOpen] = useState(true);
  if (node.kind === "file") {
    const isSelected = selected?.artifact.id === artifact.id && selected.file.path === node.path;
    return (
      <li className={`tree-row tree-file ${isSelected ? "selected" : ""}`}>
        <button type="button" className="tree-name" aria-current={isSelected || undefined} onClick={() => onSelect(node.file)} title={node.path}>
          {node.name}
        </button>
        <span className="size">{humanBytes(node.file.size)}</span>
        <code className="sha" title={`sha256 ${node.file.sha256}`}>
          {shortHash(node.file.sha256, 10)}
        </code>
        <CopyButton value={node.file.sha256} label="Copy sha256" />
      </li>
    );
  }
  return (
    <li className="tree-dir">
      <div className="tree-row">
        <button type="button" className="tree-name tree-folder" aria-expanded={open} onClick={() => setOpen(!open)}>
          <span aria-hidden="true">{open ? "▾" : "▸"}</span> {node.name}/
        </button>
        <span className="size">{humanBytes(node.size)}</span>
        <a className="btn btn-small" href={archiveUrl(workspace, artifact.id, node.path)} download aria-label={`Download folder ${node.path}`}>
          Download folder
        </a>
      </div>
      {open ? (
        <ul className="tree">
          {node.children.map((child) => (
            <TreeItem key={child.path} node={child} workspace={workspace} artifact={artifact} selected={selected} onSelect={onSelect} />
          ))}
        </ul>
      ) : null}
    </li>
  );
}

type Kind = "image" | "json" | "csv" | "log" | "text" | "binary";

const IMAGE = /\.(png|jpe?g|gif|webp|svg|bmp|ico|avif)$/i;
const IMAGE_TYPES: Record<string, string> = {
  png: "image/png",
  jpg: "image/jpeg",
  jpeg: "image/jpeg",
  gif: "image/gif",
  webp: "image/webp",
  svg: "image/svg+xml",
  bmp: "image/bmp",
  ico: "image/x-icon",
  avif: "image/avif",
};

/** The image type a blob of the file's bytes gets (an <img> of a blob never runs script, SVG included). */
export function imageType(path: string): string {
  return IMAGE_TYPES[path.split(".").pop()?.toLowerCase() ?? ""] ?? "application/octet-stream";
}
const BINARY = /\.(bin|pt|pth|ckpt|safetensors|npy|npz|zip|gz|tgz|tar|bz2|xz|zst|parquet|onnx|h5|hdf5|pkl|pickle|arrow|so|whl|pb|tflite|mp4|mp3|wav|pdf)$/i;

export function previewKind(path: string): Kind {
  if (IMAGE.test(path)) return "image";
  if (BINARY.test(path)) return "binary";
  if (/\.json$/i.test(path)) return "json";
  if (/\.(csv|tsv)$/i.test(path)) return "csv";
  if (/\.log$/i.test(path)) return "log";
  return "text";
}

function Preview({ workspace, artifact, file }: { workspace: string; artifact: Artifact; file: ArtifactFile }) {
  const url = fileUrl(workspace, artifact.id, file.path);
  const kind = previewKind(file.path);
  const [state, setState] = useState<{ text: string; truncated: boolean; binary: boolean } | null>(null);
  const [image, setImage] = useState<{ src: string } | { tooLarge: true } | null>(null);
  const [error, setError] = useState<string | null>(null);

  useEffect(() => {
    setImage(null);
    setError(null);
    if (kind !== "image") return undefined;
    const controller = new AbortController();
    let src = "";
    fetchCapped(url, IMAGE_CAP, controller.signal)
      .then(({ bytes, truncated }) => {
        if (truncated) {
          setImage({ tooLarge: true });
          return;
        }
        src = URL.createObjectURL(new Blob([bytes as BlobPart], { type: imageType(file.path) }));
        setImage({ src });
      })
      .catch((caught: unknown) => {
        if (!controller.signal.aborted) setError(caught instanceof Error ? caught.message : String(caught));
      });
    return () => {
      controller.abort();
      if (src) URL.revokeObjectURL(src);
    };
  }, [url, kind, file.path]);

  useEffect(() => {
    setState(null);
    setError(null);
    if (kind === "image" || kind === "binary") return undefined;
    const controller = new AbortController();
    fetchCapped(url, PREVIEW_CAP, controller.signal)
      .then(({ bytes, truncated }) => {
        const binary = bytes.subarray(0, 8000).includes(0);
        setState({ text: new TextDecoder().decode(bytes), truncated, binary });
      })
      .catch((caught: unknown) => {
        if (!controller.signal.aborted) setError(caught instanceof Error ? caught.message : String(caught));
      });
    return () => controller.abort();
  }, [url, kind]);

  return (
    <div className="preview">
      <div className="preview-head">
        <span className="mono">{file.path}</span>
        <span className="size">{humanBytes(file.size)}</span>
        <a className="btn btn-small" href={url} download={file.path.split("/").pop()}>
          Download
        </a>
      </div>
      <div className="preview-body">
        {error ? <p role="alert">Could not load the preview: {error}</p> : null}
        {image && "src" in image ? <img src={image.src} alt={file.path} /> : null}
        {image && "tooLarge" in image ? <p className="muted">Too large to preview ({humanBytes(file.size)}). Download it instead.</p> : null}
        {kind === "binary" || state?.binary ? <p className="muted">No preview for this file type. Download it instead.</p> : null}
        {state && !state.binary ? <TextPreview kind={kind} text={state.text} truncated={state.truncated} /> : null}
        {!state && !image && !error && kind !== "binary" ? <p className="muted">Loading preview…</p> : null}
      </div>
    </div>
  );
}

function TextPreview({ kind, text, truncated }: { kind: Kind; text: string; truncated: boolean }) {
  const note = truncated ? (
    <p className="muted">Showing the first {humanBytes(PREVIEW_CAP)}. Download the file for the rest.</p>
  ) : null;
  if (kind === "json" && !truncated) {
    const formatted = formatJson(text);
    if (formatted !== null) {
      return <pre className="code">{formatted}</pre>;
    }
    // Not valid JSON after all: shown as text below.
  }
  if (kind === "csv") {
    return (
      <>
        {note}
        <CsvTable text={text} separator={text.includes("\t") && !text.includes(",") ? "\t" : ","} />
      </>
    );
  }
  return (
    <>
      {note}
      <pre className={kind === "log" ? "code code-dark" : "code"}>{kind === "log" ? <AnsiText text={text} /> : text}</pre>
    </>
  );
}

const CSV_ROWS = 500;

function CsvTable({ text, separator }: { text: string; separator: string }) {
  const rows = parseCsv(text, separator, CSV_ROWS + 1);
  const [head, ...body] = rows;
  if (!head) return <p className="muted">Empty file.</p>;
  return (
    <div className="table-wrap">
      <table className="table csv">
        <thead>
          <tr>
            {head.map((cell, i) => (
              <th key={i} scope="col">
                {cell}
              </th>
            ))}
          </tr>
        </thead>
        <tbody>
          {body.slice(0, CSV_ROWS).map((row, r) => (
            <tr key={r}>
              {row.map((cell, i) => (
                <td key={i}>{cell}</td>
              ))}
            </tr>
          ))}
        </tbody>
      </table>
      {body.length > CSV_ROWS ? <p className="muted">First {CSV_ROWS} rows shown.</p> : null}
    </div>
  );
}

/** RFC 4180-ish: quoted fields, doubled quotes, newlines inside quotes. */
export function parseCsv(text: string, separator = ",", maxRows = Infinity): string[][] {
  const rows: string[][] = [];
  let row: string[] = [];
  let field = "";
  let quoted = false;
  for (let i = 0; i < text.length && rows.length < maxRows; i += 1) {
    const ch = text[i];
    if (quoted) {
      if (ch === '"' && text[i + 1] === '"') {
        field += '"';
        i += 1;
      } else if (ch === '"') quoted = false;
      else field += ch;
    } else if (ch === '"' && field === "") quoted = true;
    else if (ch === separator) {
      row.push(field);
      field = "";
    } else if (ch === "\n" || ch === "\r") {
      if (ch === "\r" && text[i + 1] === "\n") i += 1;
      row.push(field);
      rows.push(row);
      row = [];
      field = "";
    } else field += ch;
  }
  if ((field || row.length) && rows.length < maxRows) {
    row.push(field);
    rows.push(row);
  }
  return rows;
}

async function fetchCapped(url: string, cap: number, signal: AbortSignal): Promise<{ bytes: Uint8Array; truncated: boolean }> {
  const response = await fetch(url, { credentials: "same-origin", signal });
  if (!response.ok) throw new Error(`the server answered ${response.status}`);
  if (!response.body) {
    const all = new Uint8Array(await response.arrayBuffer());
    return { bytes: all.subarray(0, cap), truncated: all.length > cap };
  }
  const reader = response.body.getReader();
  const parts: Uint8Array[] = [];
  let size = 0;
  let truncated = false;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    parts.push(value);
    size += value.length;
    if (size > cap) {
      truncated = true;
      await reader.cancel();
      break;
    }
  }
  const bytes = new Uint8Array(size);
  let offset = 0;
  for (const part of parts) {
    bytes.set(part, offset);
    offset += part.length;
  }
  return { bytes: bytes.subarray(0, cap), truncated };
}

function sortAndSize(dir: DirNode): number {
  dir.children.sort((a, b) => (a.kind === b.kind ? a.name.localeCompare(b.name) : a.kind === "dir" ? -1 : 1));
  dir.size = dir.children.reduce((sum, child) => sum + (child.kind === "dir" ? sortAndSize(child) : child.file.size), 0);
  return dir.size;
}
