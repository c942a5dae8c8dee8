// Types of the REST and websocket contract (docs/API.md).
//
// Where the generated OpenAPI schema (schema.d.ts, `npm run gen-api`)
// describes an object precisely it is used directly; a run's jobs, their
// attempts and code (untyped objects in the schema: RunOut.jobs is a method
// field) and the websocket frames are written here from docs/API.md and
// backend/runs/api/serializers.py (JobOut, AttemptOut).
import type { components } from "./schema";

type Schemas = components["schemas"];

export type Role = Schemas["Role"];
export type RunStatus = Schemas["RunOutStatusEnum"];
export type JobStatus = "pending" | "assigned" | "running" | "stopping" | "succeeded" | "failed" | "stopped";
export type Stream = Schemas["StreamEnum"];
export type LogLine = Schemas["LogLineOut"];
export type LogPage = Schemas["LogPageOut"];
export type Tag = Schemas["TagOut"];
export type Environment = Schemas["EnvironmentOut"];
export type EnvironmentDetail = Schemas["EnvironmentDetailOut"];
export type Lineage = Schemas["LineageOut"];
export type LineageRun = Schemas["LineageRunOut"];
export type LineageEdge = Schemas["LineageEdgeOut"];
export type RunSource = Schemas["RunSourceOut"];
export type Secret = Schemas["SecretOut"];
export type Volume = Schemas["VolumeOut"];
export type AuditEvent = Schemas["AuditEventOut"];
export type AuditKind = Schemas["AuditEventOutKindEnum"];
export type AuditPage = Schemas["AuditPageOut"];
export type ArtifactFile = Schemas["ArtifactFileOut"];
/** Whether a re-run's artifacts match its original's (docs/ENVIRONMENTS.md, "Reproduced"). */
export type Reproduced = Schemas["ReproducedOut"];

/** An artifact's copy to its workflow's `to:` (docs/API.md, "Artifacts"). */
export type ArtifactExport = Schemas["ExportOut"];

export interface Artifact {
  id: string;
  job: string;
  path: string;
  status: "uploading" | "complete";
  total_size: number;
  files: ArtifactFile[];
  export?: ArtifactExport | null;
}

export interface RunRef {
  run: string;
  job: string;
}

/** A data input of a job (its workflow's `inputs:`) and the listing it reads; only on one run's page. */
export type JobDataInput = Schemas["JobDataInputOut"];
/** A volume a job mounts (its workflow's `volumes:`); only on one run's page. */
export type JobVolume = Schemas["JobVolumeOut"];

export interface JobInput {
  path: string;
  from: string;
}

export interface Resources {
  cpu: number | null;
  memory_bytes: number | null;
  gpu_count: number | null;
  gpu_name: string;
}

export type AttemptStatus = "assigned" | "running" | "stopping" | "ended";

/** Why an attempt ended (backend/runs/reasons.py); "" while it is live. */
export type TerminationReason =
  | "done"
  | "error"
  | "stopped_by_user"
  | "no_capacity"
  | "interrupted"
  | "instance_lost"
  | "image_pull"
  | "lease_expired"
  | "rejected"
  | "unreachable"
  | "max_duration"
  | "group_restart"
  | "low_gpu_utilization"
  | "stalled"
  | "budget_exceeded";

/** A machine launched for a job before its attempt got one; `outcome` is an instance reason or "launched". */
export interface OfferTried {
  offer: string; // "" for the switch of a spot_policy: auto job to on-demand
  instance: string;
  outcome: string; // a termination reason, "launched" or "switched_to_on_demand"
  code?: string; // the backend's error code (InsufficientInstanceCapacity …)
  message: string;
}

/** One try of a job on one instance. Its log lines are seqs first_seq..last_seq of the job's one log. */
export interface Attempt {
  number: number;
  status: AttemptStatus;
  instance: string | null;
  reason: TerminationReason | "";
  message: string;
  exit_code: number | null;
  started_at: string | null;
  finished_at: string | null;
  first_seq: number;
  /** null while the attempt is live. */
  last_seq: number | null;
  offers_tried: OfferTried[];
  /** The checkpoint version restored before its commands started; null (or absent) if none. */
  restored_checkpoint?: number | null;
  /** The key of the environment its commands ran in (docs/ENVIRONMENTS.md); "" (or absent) for none. */
  environment?: string;
  /** The machine's backend, type, region, zone and market; null (or absent) for an attempt without one. */
  backend?: string | null;
  instance_type?: string | null;
  region?: string | null;
  zone?: string | null;
  spot?: boolean | null;
  /** USD, a decimal string: price_per_hour × billed_seconds; null (or absent) when it held no machine. */
  cost?: string | null;
  /** USD, its machine's price per hour (docs/COST.md). */
  price_per_hour?: string | null;
  /** The whole seconds it held its machine (until now while it runs). */
  billed_seconds?: number | null;
  created_at: string;
}

export interface Job {
  id: string;
  name: string;
  workflow?: string;
  provider?: string;
  status: JobStatus;
  status_reason: string;
  exit_code: number | null;
  /** The current attempt's number; 0 before the first. */
  attempt: number;
  /** Ordered by number. */
  attempts: Attempt[];
  /** USD, a decimal string: the sum of its attempts'; null (or absent) when none held a machine. */
  cost?: string | null;
  instance: string | null;
  /** The ports the job listens on (``ports: N``: the ones its runner picked). */
  ports?: number[];
  resources: Resources;
  created_at: string;
  started_at: string | null;
  finished_at: string | null;
  last_seq: number;
  needs?: string[];
  after_running?: string[];
  cached_from?: RunRef | null;
  /** Why it was reused from the cache or runs; null until the scheduler decided. */
  cache_decision?: CacheDecision | null;
  inputs?: JobInput[];
  /** One run's page (not the runs list): what the job reads from its `inputs:` URIs. */
  data_inputs?: JobDataInput[];
  /** One run's page (not the runs list): the volumes it mounts. */
  volumes?: JobVolume[];
}

export interface CacheDecision {
  reused: boolean;
  /** "reused from <run> (cached)" or "runs: <reason>; <reason>". */
  text: string;
  run?: string;
  compared_with?: string;
  reasons: { kind: string; text: string }[];
}

export interface RunCode {
  kind: "git" | "archive";
  repo_url?: string;
  commit?: string;
  has_patch?: boolean;
}

export interface Run {
  id: string;
  name: string;
  workflow: string;
  /** The workflow's `help:` when the run was submitted; "" without one. */
  help?: string;
  status: RunStatus;
  status_reason: string;
  exit_code: number | null;
  submitted_by?: string;
  created_at: string;
  started_at: string | null;
  finished_at: string | null;
  duration_seconds: number | null;
  /** USD, a decimal string: every attempt of every job (accruing while one runs); null (or absent): none held a machine. */
  cost?: string | null;
  code: RunCode;
  jobs: Job[];
  tags?: string[];
  no_cache?: boolean;
  /** `trainyard env build`: the run only builds the workflow's environment. */
  environment_build?: boolean;
  /** A re-run: the original run's name; null (or absent) for any other run. */
  rerun_of?: string | null;
  /** A re-run: whether its artifacts match the original's; null (or absent) for any other run. */
  reproduced?: Reproduced | null;
}

export interface Page<T> {
  count: number;
  count_estimated?: boolean; // count is an estimate (the runs list, above a threshold)
  next?: string | null;
  previous?: string | null;
  results: T[];
}

export type WorkspaceRef = Schemas["WorkspaceRefOut"] & { personal?: boolean };
export type Workspace = Schemas["WorkspaceOut"];

export type Me = Schemas["MeOut"];

export type AuthConfig = Schemas["AuthConfigOut"];

export type Member = Schemas["MemberOut"];

export type Invitation = Schemas["InvitationOut"];

export type ApiToken = Schemas["TokenOut"];
export type CreatedToken = Schemas["TokenCreatedOut"];
/** A sign-in `trainyard login` asked for, looked up by its code; and the person's decision on it. */
export type DeviceRequest = Schemas["DeviceRequestOut"];
export type DeviceDecision = Schemas["DeviceDecisionOut"];
export type SshKey = Schemas["SshKeyOut"];
/** A session into a running job (docs/ACCESS.md): a shell, a terminal, a forwarded port or the apps proxy. */
export type AccessSession = Schemas["SessionOut"];

export type Repo = Schemas["RepoOut"];

export type Instance = Schemas["InstanceOut"];
export type InstanceStatus = Schemas["InstanceStatus"];

/** A job's consecutive log lines as the server sends them: the runner's
 * chunk as it came (`text`: every line followed by "\n"; `streams`: one
 * letter per line; `times`: runs of [lines, unix time]). */
export type LogsWire = {
  type: "logs";
  job: string;
  first_seq: number;
  streams: string;
  times: [number, number][];
  text: string;
};

/** A websocket frame from /ws/v1/workspaces/<ws>/runs/…, its lines unpacked
 * by live.ts into [seq, ts, stream, text]. */
export type LiveFrame =
  | { type: "run"; run: Run }
  | { type: "logs"; job: string; lines: [number, number, Stream, string][] };

export const ACTIVE_RUN_STATUSES: RunStatus[] = ["pending", "running", "stopping"];

export type Backend = Schemas["BackendOut"];
export type AwsSetup = Schemas["AwsSetupOut"];
export type Offer = Schemas["OfferOut"];
export type Offers = Schemas["OffersOut"];

/** The workspace's costs over a window, grouped (docs/COST.md, `GET …/costs/`). */
export type CostReport = Schemas["CostReportOut"];
export type CostRow = Schemas["CostRowOut"];

/**
 * A budget's row (docs/COST.md, "Budgets and quotas"; `GET …/budgets/`):
 * `user` null is the workspace's own budget, else one member's. Amounts are
 * decimal USD strings; `percent` is `spent` of `monthly_limit` (null: no limit).
 */
export type Budget = Schemas["BudgetOut"];
/** The month's budgets: the workspace's row first, then members by name. */
export type Budgets = Schemas["BudgetsOut"];
