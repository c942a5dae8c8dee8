import type { Job } from "../api/types";

/** The server path that opens a job's port in the browser, on the app's own origin (docs/ACCESS.md). */
export function openPortPath(workspace: string, run: string, job: string, port: number): string {
  return `/open/${encodeURIComponent(workspace)}/${encodeURIComponent(run)}/${encodeURIComponent(job)}/${port}/`;
}

/**
 * A job's ports. While it runs, members and admins get an Open link for each:
 * the server grants a session and opens the port on an origin of its own, in a new tab.
 */
export function JobPorts({ job, run, workspace, canOpen }: { job: Job; run: string; workspace: string; canOpen: boolean }) {
  const ports = job.ports ?? [];
  if (!ports.length || (job.status !== "running" && job.status !== "assigned")) return null;
  const openable = canOpen && job.status === "running";
  return (
    <ul className="plain ports">
      {ports.map((port) => (
        <li key={port}>
          <span className="mono">{port}</span>{" "}
          {openable ? (
            <a
              className="btn btn-small"
              href={openPortPath(workspace, run, job.name, port)}
              target="_blank"
              rel="noopener noreferrer"
              aria-label={`Open port ${port} of ${job.name} in a new tab`}
            >
              Open
            </a>
          ) : null}
        </li>
      ))}
    </ul>
  );
}
