import { useState, type FormEvent } from "react";
import { get, wsPath } from "../api/client";
import type { Offer, Offers } from "../api/types";
import { DataTable } from "../components/DataTable";
import { EmptyState, ErrorBanner, PageHeader } from "../components/ui";
import { humanBytes } from "../lib/format";
import { useResource } from "../lib/hooks";
import { useWorkspace } from "../workspace";

interface Filters {
  gpu: string;
  memory: string;
  spot_policy: string;
  region: string;
}

/** Machines the workspace's backends offer, cheapest first. */
export function OffersPage() {
  const { slug } = useWorkspace();
  const [draft, setDraft] = useState<Filters>({ gpu: "", memory: "", spot_policy: "auto", region: "" });
  const [filters, setFilters] = useState<Filters>(draft);
  const key = `${slug}/${JSON.stringify(filters)}`;
  const offers = useResource<Offers>(key, () => get<Offers>(wsPath(slug, "offers/"), { ...filters }));
  const dates = [...new Set((offers.data?.offers ?? []).map((o) => o.catalog_date).filter(Boolean))];

  const apply = (event: FormEvent) => {
    event.preventDefault();
    setFilters(draft);
  };
  const field = (name: keyof Filters) => ({
    value: draft[name],
    onChange: (e: { target: { value: string } }) => setDraft({ ...draft, [name]: e.target.value }),
  });

  return (
    <>
      <PageHeader title="Offers" />
      <form className="inline-form card" onSubmit={apply} aria-label="Filter offers">
        <label>
          GPU
          <input {...field("gpu")} placeholder="A10G or A10G:2" spellCheck={false} />
        </label>
        <label>
          Memory
          <input {...field("memory")} placeholder="16GB" spellCheck={false} />
        </label>
        <label>
          Market
          <select {...field("spot_policy")}>
            <option value="auto">spot and on-demand</option>
            <option value="spot">spot</option>
            <option value="on-demand">on-demand</option>
          </select>
        </label>
        <label>
          Region
          <input {...field("region")} placeholder="us-east-1" spellCheck={false} />
        </label>
        <button type="submit" className="btn btn-primary">
          Show offers
        </button>
      </form>
      <ErrorBanner error={offers.error} />
      <DataTable<Offer>
        rows={offers.data?.offers}
        error={offers.error}
        empty={
          <EmptyState title="No offer fits">
            {offers.data?.shortfall ? <p className="muted">{offers.data.shortfall}</p> : null}
          </EmptyState>
        }
        columns={["Backend", "Region", "Zone", "Type", "Market", { label: "Price/h", className: "num" }, { label: "CPUs", className: "num" }, "Memory", "GPUs"]}
        renderRow={(offer) => (
          <tr key={`${offer.account}/${offer.offer_id}`}>
            <td>{offer.account}</td>
            <td>{offer.region}</td>
            <td>{offer.zone || "—"}</td>
            <td className="mono">{offer.instance_type}</td>
            <td>{offer.spot ? "spot" : "on-demand"}</td>
            <td className="num">${offer.price_per_hour.toFixed(4)}</td>
            <td className="num">{offer.cpus}</td>
            <td>{humanBytes(offer.memory_bytes)}</td>
            <td>{offer.gpus.length ? `${offer.gpus.length}× ${offer.gpus[0].name}` : "—"}</td>
          </tr>
        )}
      />
      {dates.length ? <p className="small muted">Prices from the catalog of {dates.join(", ")}.</p> : null}
    </>
  );
}
