/* server/ui.c: the heatmap page's bytes (see ui.h). The Makefile writes them from
 * server/ui/index.html into $(BUILD)/gen/ui_page.c with od and sed, so a fresh Debian builds it
 * with coreutils alone; this file only hands them out.
 */
#include "ui.h"

/* Defined in $(BUILD)/gen/ui_page.c: index.html's bytes, then a NUL, and their count without it. */
extern const unsigned char ui_page_html[];
extern const size_t ui_page_html_bytes;

const char *ui_page(size_t *len) {
    *len = ui_page_html_bytes;
    return (const char *)ui_page_html;
}
