import { afterEach, describe, expect, it, vi } from "vitest";
import { SEARCH_REQUESTS, apiLogSource } from "../pages/RunDetail";

/** The server's answers to a search, one per request, with the from_seq each asked from. */
function server(answers: Array<{ seq: number | null; partial: boolean; searched_to: number | null }>) {
  const asked: number[] = [];
  const fetchMock = vi.fn(async (url: string) => {
    asked.push(Number(new URL(url, window.location.origin).searchParams.get("from_seq")));
    const answer = answers[Math.min(asked.length - 1, answers.length - 1)];
    return new Response(JSON.stringify({ job: "j", last_seq: 100_000, ...answer }));
  });
  vi.stubGlobal("fetch", fetchMock);
  return asked;
}

describe("a log search past the server's byte budget", () => {
  afterEach(() => vi.unstubAllGlobals());

  it("asks again from just past where each partial answer stopped until it finds the line", async () => {
    const asked = server([
      { seq: null, partial: true, searched_to: 30_000 },
      { seq: null, partial: true, searched_to: 60_000 },
      { seq: 71_234, partial: false, searched_to: null },
    ]);

    const seq = await apiLogSource("acme").search("j", "needle", 1, "next");

    expect(seq).toBe(71_234);
    expect(asked).toEqual([1, 30_001, 60_001]);
  });

  it("goes backward from just before where a prev search stopped", async () => {
    const asked = server([
      { seq: null, partial: true, searched_to: 70_001 },
      { seq: null, partial: false, searched_to: null },
    ]);

    expect(await apiLogSource("acme").search("j", "needle", 100_000, "prev")).toBeNull();
    expect(asked).toEqual([100_000, 70_000]);
  });

  it("stops after a bounded number of requests", async () => {
    let to = 0;
    const asked: number[] = [];
    vi.stubGlobal("fetch", vi.fn(async (url: string) => {
      asked.push(Number(new URL(url, window.location.origin).searchParams.get("from_seq")));
      to += 1000;
      return new Response(JSON.stringify({ job: "j", last_seq: 10 ** 9, seq: null, partial: true, searched_to: to }));
    }));

    expect(await apiLogSource("acme").search("j", "needle", 1, "next")).toBeNull();
    expect(asked).toHaveLength(SEARCH_REQUESTS);
  });
});
