/** The lines that install Trainyard's packages from this server's own wheels
 * (docs/CLI.md, "Installing"): the names are not on PyPI yet, so pip takes them
 * from the server and their other dependencies from the user's usual index. */

export function cliInstallCommand(serverUrl: string): string {
  return `pip install --extra-index-url ${serverUrl}/cli/wheels/ trainyard-cli`;
}

export function runnerInstallCommand(serverUrl: string): string {
  return `pip install --extra-index-url ${serverUrl}/runner/wheels/ trainyard-runner`;
}
