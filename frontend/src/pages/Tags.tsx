import { Link } from "react-router-dom";
import { del, get, wsPath } from "../api/client";
import type { Tag } from "../api/types";
import { ACTIONS_COLUMN, DataTable } from "../components/DataTable";
import { ConfirmButton, EmptyState, ErrorBanner, PageHeader, Time } from "../components/ui";
import { useApiList } from "../lib/hooks";
import { useWorkspace } from "../workspace";

export function TagsPage() {
  const { slug, canWrite } = useWorkspace();
  const tags = useApiList<Tag>(slug, () => get<Tag[]>(wsPath(slug, "tags/")));
  const remove = (name: string) => tags.act(() => del(wsPath(slug, `tags/${encodeURIComponent(name)}/`)));
  return (
    <>
      <PageHeader title="Tags" />
      <p className="lede">A tag names a succeeded run so that other workflows can take its artifacts as inputs (<code>from: tag:NAME</code>).</p>
      <ErrorBanner error={tags.error ?? tags.actionError} />
      <DataTable
        rows={tags.data}
        error={tags.error}
        empty={
          <EmptyState title="No tags yet">
            <p className="muted">
              Tag a succeeded run from its page, or with <code>trainyard tag NAME RUN</code>.
            </p>
          </EmptyState>
        }
        columns={["Tag", "Run", "By", "Updated", canWrite && ACTIONS_COLUMN]}
        renderRow={(tag) => (
          <tr key={tag.name}>
            <td>
              <span className="tag">{tag.name}</span>
            </td>
            <td>
              <Link to={`/w/${slug}/runs/${tag.run}`}>{tag.run}</Link>
            </td>
            <td>{tag.created_by || "—"}</td>
            <td>
              <Time iso={tag.updated_at} />
            </td>
            {canWrite ? (
              <td className="actions">
                <ConfirmButton label="Delete" confirmLabel={`Delete tag ${tag.name}`} onConfirm={() => remove(tag.name)} />
              </td>
            ) : null}
          </tr>
        )}
      />
    </>
  );
}
