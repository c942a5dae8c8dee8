import { Link } from "react-router-dom";
import type { Reproduced, Run } from "../api/types";

const DIFFERENCES_SHOWN = 5;

const LABELS: Record<Reproduced["state"], string> = {
  reproduced: "reproduced",
  differs: "differs",
  not_comparable: "not comparable",
  pending: "not compared yet",
};

/**
 * "Re-run of <original>" linking to it, and whether the re-run's artifacts
 * match the original's (docs/ENVIRONMENTS.md, "Reproduced"): a badge with
 * the detail as its title, the differing artifacts listed under it, or why
 * nothing could be compared. Nothing for a run that is no re-run.
 */
export function RerunBadge({ run, workspace }: { run: Run; workspace: string }) {
  if (!run.rerun_of) return null;
  const verdict = run.reproduced;
  return (
    <div className="rerun">
      <span>
        Re-run of <Link to={`/w/${workspace}/runs/${encodeURIComponent(run.rerun_of)}`}>{run.rerun_of}</Link>
      </span>
      {verdict ? (
        <span className={`badge badge-${verdict.state}`} data-state={verdict.state} title={verdict.detail}>
          <span className="badge-dot" aria-hidden="true" />
          {LABELS[verdict.state]}
        </span>
      ) : null}
      {verdict && verdict.state !== "differs" ? <span className="muted">{verdict.detail}</span> : null}
      {verdict?.state === "differs" ? (
        <ul className="plain rerun-differences" aria-label="Artifacts that differ">
          {verdict.differences.slice(0, DIFFERENCES_SHOWN).map((d) => (
            <li key={`${d.job} ${d.path}`} className="mono">
              {d.text}
            </li>
          ))}
          {verdict.differences.length > DIFFERENCES_SHOWN ? (
            <li className="muted">and {verdict.differences.length - DIFFERENCES_SHOWN} more</li>
          ) : null}
        </ul>
      ) : null}
    </div>
  );
}
