// The session: the token the user pasted and the view on screen.
//
// The token (ADR-0033) is kept in this tab's sessionStorage only: closing the tab forgets it, and it is never
// a cookie. Signing in or out redraws the page through the handler the router registers (onSessionChange),
// so that the login form need not know the router.

const TOKEN_KEY = "nodus.token";

let view = null; // the AbortController of the view shown: leaving it ends its requests and watches
let changed = () => {};

export const token = () => sessionStorage.getItem(TOKEN_KEY);

export function onSessionChange(handler) {
  changed = handler;
}

export function signIn(given) {
  sessionStorage.setItem(TOKEN_KEY, given);
  changed();
}

export function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  changed();
}

export function forgetToken() {
  // The gateway refused the token (401): drop it without a redraw; the caller shows the login prompt.
  sessionStorage.removeItem(TOKEN_KEY);
}

export function newView() {
  // The signal of the view about to be shown; the one shown before ends with it.
  endView();
  view = new AbortController();
  return view.signal;
}

export function endView() {
  if (view) view.abort();
}
