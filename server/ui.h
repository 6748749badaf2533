/* server/ui.h: the heatmap page served at GET /ui. Its source is server/ui/index.html, compiled
 * into the daemon by the Makefile (as $(BUILD)/gen/ui_page.c), so the binary needs no file at run
 * time. What the page shows and asks of the API is the page's own business; route.c serves it.
 */
#ifndef SERVER_UI_H
#define SERVER_UI_H

#include <stddef.h>

/* The page: UTF-8 HTML, *len bytes (a NUL follows them). Borrowed and static: valid for the
 * process's life, on any thread. Cannot fail. */
const char *ui_page(size_t *len);

#endif /* SERVER_UI_H */
