import type { Attempt, OfferTried } from "../api/types";
import { attemptWhere, clockTime, reasonDescription, reasonLabel } from "../lib/attempts";
import { absoluteTime, elapsedSeconds, humanDuration, money } from "../lib/format";
import { StatusBadge } from "./ui";

/** A job's attempts: where each ran, when, and why it ended (with the offers launched for it). */
export function AttemptsTable({
  attempts,
  now,
  lockUrl,
}: {
  attempts: readonly Attempt[];
  now: number;
  /** Where an environment's lock downloads from (its key). */
  lockUrl?: (key: string) => string;
}) {
  if (!attempts.length) return null;
  const sorted = [...attempts].sort((a, b) => a.number - b.number);
  const withOffers = sorted.some((a) => a.offers_tried.length > 0);
  return (
    <section className="attempts" aria-labelledby="attempts-heading">
      <h3 id="attempts-heading">Attempts</h3>
      <div className="table-wrap">
        <table className="table attempts-table">
          <thead>
            <tr>
              <th className="num">#</th>
              <th>Instance</th>
              <th>Started</th>
              <th>Ended</th>
              <th className="num">Duration</th>
              <th className="num">Cost</th>
              <th>Outcome</th>
              {withOffers ? <th>Offers tried</th> : null}
            </tr>
          </thead>
          <tbody>
            {sorted.map((attempt) => (
              <tr key={attempt.number} data-attempt={attempt.number}>
                <td className="num">{attempt.number}</td>
                <td>
                  <span className="mono">{attempt.instance ?? <span className="muted">—</span>}</span>
                  {attemptWhere(attempt) ? <div className="small muted attempt-where">{attemptWhere(attempt)}</div> : null}
                  {attempt.restored_checkpoint ? (
                    <div className="small muted">resumed from checkpoint {attempt.restored_checkpoint}</div>
                  ) : null}
                  {attempt.environment ? (
                    <div className="small muted attempt-environment">
                      environment <span className="mono">{attempt.environment}</span>
                      {lockUrl ? (
                        <>
                          {" · "}
                          <a href={lockUrl(attempt.environment)} download>
                            lock
                          </a>
                        </>
                      ) : null}
                    </div>
                  ) : null}
                </td>
                <td>
                  <Clock iso={attempt.started_at} />
                </td>
                <td>
                  <Clock iso={attempt.finished_at} />
                </td>
                <td className="num">{humanDuration(elapsedSeconds(attempt.started_at, attempt.finished_at, now))}</td>
                <td className="num attempt-cost" title={costTitle(attempt)}>
                  {money(attempt.cost)}
                  {attempt.cost != null && attempt.price_per_hour != null ? (
                    <div className="small muted attempt-price">
                      ${Number(attempt.price_per_hour)}/h × {humanDuration(attempt.billed_seconds)}
                    </div>
                  ) : null}
                </td>
                <td className="attempt-outcome">
                  <Outcome attempt={attempt} />
                </td>
                {withOffers ? (
                  <td>
                    <Offers offers={attempt.offers_tried} />
                  </td>
                ) : null}
              </tr>
            ))}
          </tbody>
        </table>
      </div>
    </section>
  );
}

/** How an attempt's cost is made: its machine's price × the time it held it. */
function costTitle(attempt: Attempt): string | undefined {
  if (attempt.cost == null || attempt.price_per_hour == null) return "It held no machine";
  const price = Number(attempt.price_per_hour);
  return `$${price}/h × ${humanDuration(attempt.billed_seconds)} held = USD ${attempt.cost}`;
}

function Clock({ iso }: { iso: string | null }) {
  if (!iso) return <span className="muted">—</span>;
  return (
    <time dateTime={iso} title={absoluteTime(iso)}>
      {clockTime(iso)}
    </time>
  );
}

function Outcome({ attempt }: { attempt: Attempt }) {
  if (attempt.status !== "ended") return <StatusBadge status={attempt.status} />;
  return (
    <>
      <span className={`attempt-reason reason-${attempt.reason || "unknown"}`} title={reasonDescription(attempt.reason)}>
        {reasonLabel(attempt.reason) || "ended"}
      </span>
      {attempt.exit_code !== null ? <span className="muted"> · exit code {attempt.exit_code}</span> : null}
      {attempt.message ? <div className="small muted attempt-message">{attempt.message}</div> : null}
    </>
  );
}

function Offers({ offers }: { offers: readonly OfferTried[] }) {
  if (!offers.length) return <span className="muted">—</span>;
  return (
    <ul className="plain small attempt-offers">
      {offers.map((offer) => (
        <li key={offer.instance || offer.offer || offer.outcome} title={offer.instance ? `instance ${offer.instance}` : undefined}>
          {offer.outcome === "switched_to_on_demand" ? (
            <>spot → on-demand</>
          ) : offer.outcome === "launched" ? (
            <>
              launched <span className="mono">{offer.offer}</span>
            </>
          ) : (
            <>
              tried <span className="mono">{offer.offer}</span>: {offer.outcome.replace(/_/g, " ")}
              {offer.code ? <span className="mono"> ({offer.code})</span> : null}
            </>
          )}
          {offer.message ? <span className="muted"> — {offer.message}</span> : null}
        </li>
      ))}
    </ul>
  );
}
