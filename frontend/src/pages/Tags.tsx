import { Link } from "react-router-dom";
import { del, errorMessage, get, wsPath } from "../api/client";
import type { Tag } from "../api/types";
import { ConfirmButton, EmptyState, ErrorBanner, Loading, PageHeader, Time } from "../components/ui";
import { useResource } from "../lib/hooks";
import { useWorkspace } from "../workspace";
import { useState } from "react";

export function TagsPage() {
  const { slug, canWrite } = useWorkspace();
  const tags = useResource<Tag[]>(slug, () => get<Tag[]>(wsPath(slug, "tags/")));
  const [error, setError] = useState<string | null>(null);

  const remove = async (name: string) => {
    try {
      await del(wsPath(slug, `tags/${encodeURIComponent(name)}/`));
      await tags.reload();
    } catch (caught) {
      setError(errorMessage(caught));
    }
  };
  return (
    <>
      <PageHeader title="Tags" />
      <p className="lede">A tag names a succeeded run so that other workflows can take its artifacts as inputs (<code>from: tag:NAME</code>).</p>
      <ErrorBanner error={tags.error ?? error} />
      {!tags.data ? <Loading /> : null}
      {tags.data && !tags.data.length ? (
        <EmptyState title="No tags yet">
          <p className="muted">
            Tag a succeeded run from its page, or with <code>trainyard tag NAME RUN</code>.
          </p>
        </EmptyState>
      ) : null}
      {tags.data && tags.data.length ? (
        <div className="table-wrap">
          <table className="table">
            <thead>
              <tr>
                <th scope="col">Tag</th>
                <th scope="col">Run</th>
                <th scope="col">By</th>
                <th scope="col">Updated</th>
                {canWrite ? <th scope="col"><span className="visually-hidden">Actions</span></th> : null}
              </tr>
            </thead>
            <tbody>
              {tags.data.map((tag) => (
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
              ))}
            </tbody>
          </table>
        </div>
      ) : null}
    </>
  );
}
