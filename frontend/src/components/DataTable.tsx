import type { ReactNode } from "react";
import { Loading } from "./ui";

/** A column header: its text, or its text and a class (e.g. `num`). */
export type Column = ReactNode | { label: ReactNode; className?: string };

/** The header of a row-actions column: named for screen readers only. */
export const ACTIONS_COLUMN: Column = { label: <span className="visually-hidden">Actions</span> };

function isLabelled(column: Column): column is { label: ReactNode; className?: string } {
  return typeof column === "object" && column !== null && "label" in column;
}

/**
 * A list's table with its loading and empty states: a spinner until `rows`
 * arrive (none if loading failed: the page shows the error), `empty` when
 * there are no rows (if given; otherwise the table with no rows), else the
 * table. `columns` may hold `false`/`null` for columns the viewer doesn't get.
 */
export function DataTable<T>({
  rows,
  error,
  empty,
  columns,
  renderRow,
  className = "table",
}: {
  rows: T[] | undefined;
  error?: string | null;
  empty?: ReactNode;
  columns: Array<Column | false | null | undefined>;
  renderRow: (row: T) => ReactNode;
  className?: string;
}) {
  if (!rows) return error ? null : <Loading />;
  if (!rows.length && empty !== undefined) return <>{empty}</>;
  return (
    <div className="table-wrap">
      <table className={className}>
        <thead>
          <tr>
            {columns.map((column, index) =>
              column === false || column === null || column === undefined ? null : isLabelled(column) ? (
                <th key={index} scope="col" className={column.className}>
                  {column.label}
                </th>
              ) : (
                <th key={index} scope="col">
                  {column}
                </th>
              ),
            )}
          </tr>
        </thead>
        <tbody>{rows.map(renderRow)}</tbody>
      </table>
    </div>
  );
}
