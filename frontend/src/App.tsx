import { Navigate, Route, Routes } from "react-router-dom";
import { useAuth } from "./auth";
import { ErrorBanner, Loading } from "./components/ui";
import { rememberedWorkspace } from "./lib/hooks";
import { Layout } from "./pages/Layout";
import { SignInPage } from "./pages/SignIn";
import { RunsPage } from "./pages/Runs";
import { RunPage } from "./pages/RunDetail";
import { ComparePage } from "./pages/Compare";
import { TagsPage } from "./pages/Tags";
import { EnvironmentsPage } from "./pages/Environments";
import { NewRunPage } from "./pages/NewRun";
import { VolumesPage } from "./pages/Volumes";
import { ReposPage } from "./pages/Repos";
import { InstancesPage } from "./pages/Instances";
import { SelfHostedPage } from "./pages/SelfHosted";
import { SessionsPage } from "./pages/Sessions";
import { BackendsPage } from "./pages/Backends";
import { OffersPage } from "./pages/Offers";
import { CostsPage } from "./pages/Costs";
import { SecretsPage } from "./pages/Secrets";
import { MembersPage } from "./pages/Members";
import { AuditPage } from "./pages/Audit";
import { TokensPage } from "./pages/Tokens";
import { SshKeysPage } from "./pages/SshKeys";
import { NewWorkspacePage } from "./pages/NewWorkspace";
import { DevicePage } from "./pages/Device";

export function App() {
  const auth = useAuth();
  if (auth.status === "loading") return <Loading label="Loading Trainyard…" />;
  if (auth.status === "error") {
    return (
      <main className="centered">
        <ErrorBanner error={`Cannot reach the server: ${auth.error}`} />
        <button type="button" className="btn" onClick={() => void auth.refresh()}>
          Try again
        </button>
      </main>
    );
  }
  if (auth.status === "signed-out") return <SignInPage />;
  return (
    <Routes>
      <Route path="/" element={<HomeRedirect />} />
      <Route path="/device" element={<DevicePage />} />
      <Route path="/w/:ws" element={<Layout />}>
        <Route index element={<Navigate to="runs" replace />} />
        <Route path="runs" element={<RunsPage />} />
        <Route path="runs/new" element={<NewRunPage />} />
        <Route path="runs/:run" element={<RunPage />} />
        <Route path="compare" element={<ComparePage />} />
        <Route path="tags" element={<TagsPage />} />
        <Route path="environments" element={<EnvironmentsPage />} />
        <Route path="volumes" element={<VolumesPage />} />
        <Route path="repos" element={<ReposPage />} />
        <Route path="instances" element={<InstancesPage />} />
        <Route path="sessions" element={<SessionsPage />} />
        <Route path="self-hosted" element={<SelfHostedPage />} />
        <Route path="backends" element={<BackendsPage />} />
        <Route path="offers" element={<OffersPage />} />
        <Route path="costs" element={<CostsPage />} />
        <Route path="secrets" element={<SecretsPage />} />
        <Route path="members" element={<MembersPage />} />
        <Route path="audit" element={<AuditPage />} />
        <Route path="tokens" element={<TokensPage />} />
        <Route path="ssh-keys" element={<SshKeysPage />} />
        <Route path="new-workspace" element={<NewWorkspacePage />} />
      </Route>
      <Route path="*" element={<HomeRedirect />} />
    </Routes>
  );
}

/** `/` → the remembered workspace, else the default one, else the first. */
function HomeRedirect() {
  const { me } = useAuth();
  const slugs = me?.workspaces.map((w) => w.slug) ?? [];
  const remembered = rememberedWorkspace();
  const slug =
    (remembered && slugs.includes(remembered) ? remembered : null) ??
    me?.default_workspace ??
    slugs[0];
  if (!slug) {
    return (
      <main className="centered">
        <h1>No workspace yet</h1>
        <p>Ask a workspace admin to invite you, then sign in again.</p>
      </main>
    );
  }
  return <Navigate to={`/w/${slug}/runs`} replace />;
}
