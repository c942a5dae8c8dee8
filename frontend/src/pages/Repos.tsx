import { get, wsPath } from "../api/client";
import type { Repo } from "../api/types";
import { DataTable } from "../components/DataTable";
import { EmptyState, ErrorBanner, PageHeader, Time } from "../components/ui";
import { useResource } from "../lib/hooks";
import { useWorkspace } from "../workspace";

export function ReposPage() {
  const { slug } = useWorkspace();
  const repos = useResource<Repo[]>(slug, () => get<Repo[]>(wsPath(slug, "repos/")));
  return (
    <>
      <PageHeader title="Repos" />
      <p className="lede">Repositories that runs of this workspace were submitted from.</p>
      <ErrorBanner error={repos.error} />
      <DataTable
        rows={repos.data}
        error={repos.error}
        empty={
          <EmptyState title="No repositories yet">
            <p className="muted">A repository appears here after its first run from a git checkout.</p>
          </EmptyState>
        }
        columns={["Repository", "URL", { label: "Runs", className: "num" }, "Last run"]}
        renderRow={(repo) => (
          <tr key={repo.id}>
            <td>{repo.name}</td>
            <td className="mono small">
              {/^https?:\/\//.test(repo.url) ? (
                <a href={repo.url} target="_blank" rel="noreferrer noopener">
                  {repo.url}
                </a>
              ) : (
                repo.url
              )}
            </td>
            <td className="num">{repo.runs}</td>
            <td>
              <Time iso={repo.last_run_at} />
            </td>
          </tr>
        )}
      />
    </>
  );
}
