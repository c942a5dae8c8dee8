import type { Job, JobDataInput } from "../api/types";
import { humanBytes } from "../lib/format";

/**
 * The Data and Volumes facts of a job (docs/DATA.md): each `inputs:` URI with the path it is placed at and the
 * listing it reads, and each volume with where it is mounted. Nothing for a job without them.
 */
export function JobDataFacts({ job }: { job: Pick<Job, "data_inputs" | "volumes"> }) {
  const inputs = job.data_inputs ?? [];
  const volumes = job.volumes ?? [];
  return (
    <>
      {inputs.length ? (
        <div className="fact">
          <dt>Data</dt>
          <dd>
            <ul className="plain">
              {inputs.map((input) => (
                <li key={input.path}>
                  <span className="mono">{input.uri}</span> → <span className="mono">{input.path}</span>
                  <span className="muted"> · {listingWords(input)}</span>
                </li>
              ))}
            </ul>
          </dd>
        </div>
      ) : null}
      {volumes.length ? (
        <div className="fact">
          <dt>Volumes</dt>
          <dd>
            <ul className="plain">
              {volumes.map((volume) => (
                <li key={volume.name}>
                  <span className="mono">{volume.name}</span> at <span className="mono">{volume.path}</span>
                  {volume.read_only ? <span className="muted"> (read-only)</span> : null}
                </li>
              ))}
            </ul>
          </dd>
        </div>
      ) : null}
    </>
  );
}

/** "200 files, 1.8 GiB, versioned"; "listing not known" when the server has none. */
export function listingWords(input: JobDataInput): string {
  if (input.file_count === null || input.file_count === undefined) return "listing not known";
  const files = `${input.file_count.toLocaleString("en-US")} file${input.file_count === 1 ? "" : "s"}`;
  return [files, humanBytes(input.total_size), input.versioned ? "versioned" : null, input.read_only ? null : "writable"]
    .filter(Boolean)
    .join(", ");
}
